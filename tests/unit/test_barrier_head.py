"""Which version an epoch ended on, when the next epoch's merges are already in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flows.epoch import barrier_head
from vcdl.ledger import Version


def _versions(epochs: list[int | None]) -> list[Version]:
    return [
        Version(run="r", number=n, epoch=e, uri="u", checksum="c") for n, e in enumerate(epochs)
    ]


def test_the_head_ignores_the_next_epochs_merges() -> None:
    vs = _versions([None, 0, 0, 0, 1, 1])
    assert barrier_head(vs, 0) == 3
    assert barrier_head(vs, 1) == 5


def test_an_epoch_without_merges_ends_on_the_one_before() -> None:
    assert barrier_head(_versions([None]), 0) == 0  # nothing merged yet: v0
    assert barrier_head(_versions([None, 0, 0, 2]), 1) == 2


def test_a_late_shard_of_the_epoch_moves_its_head_past_a_later_merge() -> None:
    # A quorum-deferred shard of epoch 0 merged after epoch 1's v2: the rule
    # takes v3 (it contains v2), the inexactness epoch.py's docstring names.
    assert barrier_head(_versions([None, 0, 1, 0, 1]), 0) == 3


@given(st.lists(st.integers(0, 5), max_size=30), st.integers(0, 5))
def test_no_later_epoch_below_the_head(epochs: list[int], epoch: int) -> None:
    vs = _versions([None, *sorted(epochs)])
    head = barrier_head(vs, epoch)
    assert all(v.epoch is None or v.epoch <= epoch for v in vs[: head + 1])
    assert all(v.epoch is not None and v.epoch > epoch for v in vs[head + 1 :])

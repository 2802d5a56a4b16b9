"""The replay's pure parts: its plan from ledger rows, and where a re-training stops."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from vcdl.config import TrainSection
from vcdl.ledger import Attempt, Version
from vcdl.ledger.models import FOLDED_CHECKSUM
from vcdl.replay.plan import NotReplayable, plan_replay
from vcdl.replay.retrain import batch_ends, stop_at
from vcdl.worker.loop import train_attempt


def attempt(ident: str, base: int, samples: int = 100, **inputs: Any) -> Attempt:
    record = {"format": 1, "seed": 7, "start_samples": 0, "device": "cpu", "threads": 1, **inputs}
    resumed = inputs.pop("resumed", None)
    return Attempt(
        id=ident,
        run="r",
        subtask_id=1,
        epoch=0,
        shard=int(ident[-1]) if ident[-1].isdigit() else 0,
        number=1,
        worker="w",
        base_version=base,
        state="merged",
        samples=samples,
        resumed_from=resumed,
        replay_inputs=json.dumps({k: v for k, v in record.items() if k != "resumed"}),
    )


def version(n: int, attempt_id: str | None, staleness: int = 0, **kw: Any) -> Version:
    return Version(
        run="r",
        number=n,
        parent=n - 1 if n else None,
        attempt_id=attempt_id,
        alpha=0.5 if n else None,
        staleness=staleness if n else None,
        uri=f"r/v{n}",
        checksum=kw.get("checksum", f"c{n}"),
        pruned_at=kw.get("pruned_at"),
    )


def test_a_plan_lists_merges_in_order_and_trainings_after_their_sources() -> None:
    attempts = [
        attempt("a1", 0, samples=40),  # killed at 40 samples; its checkpoint resumed by a2
        attempt("a2", 0, start_samples=40, resumed="a1"),
        attempt("a3", 0, optimizer_from="a2"),
        attempt("a4", 1, variable_from="a3", variable_alpha=0.5),
    ]
    versions = [version(0, None), version(1, "a2"), version(2, "a3", 1), version(3, "a4", 1)]
    plan = plan_replay("r", versions, attempts)
    assert [m.number for m in plan.merges] == [1, 2, 3]
    keys = [t.key for t in plan.trainings]
    assert keys == [("a1", 40), ("a2", 100), ("a3", 100), ("a4", 100)]
    a2 = plan.trainings[1]
    assert a2.resumed_from == ("a1", 40) and a2.start_samples == 40
    assert plan.trainings[2].optimizer_from == ("a2", 100)
    assert plan.trainings[3].variable_from == ("a3", 100)
    assert plan.merges[2].training == ("a4", 100) and plan.bases == {0, 1}

    later = plan_replay("r", versions, attempts, first=1, last=2)
    assert [m.number for m in later.merges] == [2]
    # a3 continued a2's optimizer: a2 (and the checkpoint it resumed) train again.
    assert [t.attempt_id for t in later.trainings] == ["a1", "a2", "a3"]


def test_a_run_recorded_before_the_migration_says_why_it_cannot_be_replayed() -> None:
    old = attempt("a1", 0)
    old.replay_inputs = None
    with pytest.raises(NotReplayable, match=r"a1.*merged as version 1.*migration 0011"):
        plan_replay("r", [version(0, None), version(1, "a1")], [old])


@pytest.mark.parametrize(
    ("first", "last", "match"),
    [(5, None, "no version 5"), (0, 9, "--to 9"), (1, 1, "one version"), (1, 2, "not kept")],
)
def test_a_bad_range_is_one_line(first: int, last: int | None, match: str) -> None:
    versions = [
        version(0, None),
        version(1, "a1", checksum=FOLDED_CHECKSUM),
        version(2, "a2", 1),
    ]
    attempts = [attempt("a1", 0), attempt("a2", 0)]
    with pytest.raises(NotReplayable, match=match):
        plan_replay("r", versions, attempts, first=first, last=last)


def test_a_folded_version_is_re_made_but_not_compared() -> None:
    versions = [version(0, None), version(1, "a1", checksum=FOLDED_CHECKSUM), version(2, "a2", 1)]
    plan = plan_replay("r", versions, [attempt("a1", 0), attempt("a2", 0)])
    assert [(m.folded, m.kept) for m in plan.merges] == [(True, False), (False, True)]


def test_a_staleness_the_lineage_contradicts_is_refused() -> None:
    with pytest.raises(NotReplayable, match="staleness 3"):
        plan_replay("r", [version(0, None), version(1, "a1", 3)], [attempt("a1", 0)])


@given(
    n=st.integers(1, 60),
    local_epochs=st.integers(1, 3),
    batch_size=st.integers(1, 25),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_stop_at_ends_training_at_the_recorded_samples(
    n: int, local_epochs: int, batch_size: int, data: st.DataObject
) -> None:
    """The stop ends the real training loop exactly where the original did, from any
    resumed checkpoint: a partial result's, or a checkpoint a later attempt resumed."""
    ends = batch_ends(n, local_epochs, batch_size)
    start = data.draw(st.sampled_from([0, *ends[:-1]]))
    targets = batch_ends(n, local_epochs, batch_size, start)
    target = data.draw(st.sampled_from(targets))
    assert targets == [e for e in ends if e > start]  # a resume keeps the batches' ends
    model = nn.Linear(2, 2)
    cfg = TrainSection(batch_size=batch_size, local_epochs=local_epochs, objective="regression")
    arrays = {"x": torch.zeros(n, 2).numpy(), "y": torch.zeros(n, 2).numpy()}
    result = train_attempt(
        model,
        model.state_dict(),
        arrays,
        cfg,
        seed=1,
        start_samples=start,
        should_stop=stop_at(target, n, local_epochs, batch_size, start),
    )
    assert result.samples == target
    assert result.interrupted == (target < n * local_epochs)


def test_a_stop_off_the_batch_boundaries_is_refused() -> None:
    assert batch_ends(10, 2, 4) == [4, 8, 10, 14, 18, 20]
    assert stop_at(20, 10, 2, 4) is None
    with pytest.raises(NotReplayable, match="batch boundary"):
        stop_at(9, 10, 2, 4)

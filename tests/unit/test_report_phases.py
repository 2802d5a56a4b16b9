"""vcdl.views.status.phase_means: the per-attempt overhead breakdown of `vcdl status`."""

from __future__ import annotations

import json

import pytest

from vcdl.ledger import Attempt
from vcdl.views.status import phase_means


def _attempt(state: str, timings: dict[str, float] | None) -> Attempt:
    return Attempt(
        run="r", subtask_id=1, epoch=0, shard=0, number=1, worker="w", base_version=0,
        state=state, timings=json.dumps(timings) if timings is not None else None,
    )  # fmt: skip


def test_phase_means_over_merged_attempts_with_a_breakdown() -> None:
    attempts = [
        _attempt("merged", {"train": 4.0, "prefect": 0.2}),
        _attempt("merged", {"train": 6.0, "prefect": 0.4, "scheduling": 0.1}),
        _attempt("merged", None),  # recorded before attempt.timings existed
        _attempt("killed", {"train": 100.0}),  # not merged: not in the breakdown
    ]
    got = phase_means(attempts)
    assert list(got) == ["prefect", "scheduling", "train"]
    assert got["train"] == pytest.approx(5.0) and got["prefect"] == pytest.approx(0.3)
    assert got["scheduling"] == pytest.approx(0.05)  # a phase missing from one counts as 0
    assert phase_means([]) == {} and phase_means(attempts[2:]) == {}


def test_unreadable_timings_are_no_breakdown() -> None:
    bad = _attempt("merged", None).model_copy(update={"timings": "not json"})
    assert phase_means([bad]) == {}


def test_checkpoint_failures_are_counted_not_averaged_as_a_phase() -> None:
    from vcdl.views.status import checkpoint_failures
    from vcdl.worker.checkpoints import FAILURES_KEY

    attempts = [
        _attempt("merged", {"train": 4.0, FAILURES_KEY: 2.0}),
        _attempt("merged", {"train": 6.0}),
        _attempt("killed", {FAILURES_KEY: 1.0}),  # not merged, yet it failed to checkpoint
    ]
    assert FAILURES_KEY not in phase_means(attempts)
    assert checkpoint_failures(attempts) == 3
    assert checkpoint_failures(attempts[1:2]) == 0

"""vcdl.driver.epoch_state: the epoch's rules, one table row each, and a random-order property.

No cluster, no ledger: the events carry the facts. The property test plays
random orders of kills, re-runs, hand-backs under notice, partial results,
rejections, deadlines, late results and quorum clocks against a small model
of the ledger and the cluster, and checks that no subtask is merged twice,
none is lost, and the attempt budget holds.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcdl.driver.epoch_attempts import free_attempts, settle
from vcdl.driver.epoch_events import (
    FREE_HANDBACKS,
    Abandon,
    AbandonRunning,
    Advance,
    AtBarrier,
    AttemptFact,
    AwaitEvaluation,
    Cancel,
    Close,
    DeadlinePassed,
    DropCheckpoint,
    EpochPolicy,
    Evaluate,
    Event,
    FailEpoch,
    Gathered,
    Instruction,
    Key,
    MarkCrashed,
    Merge,
    MergeDone,
    MergeGroup,
    Note,
    Opened,
    Prune,
    RecordDuplicate,
    RecordLate,
    Reject,
    Say,
    Settle,
    StartEarly,
    Submit,
    TaskLost,
    TaskReturned,
    Tick,
    recorded_return,
)
from vcdl.driver.epoch_state import EpochState
from vcdl.states import MERGEABLE_ATTEMPT_STATES, TERMINAL_SUBTASK_STATES

K = (2, 5)  # the subtask most rows are about


def a(n: int, state: str, samples: int | None = None, key: Key = K) -> AttemptFact:
    return AttemptFact(f"a{key[0]}.{key[1]}.{n}", key, n, state, samples)


def opened(policy: EpochPolicy | None = None, todo: tuple[Key, ...] = (K,)) -> EpochState:
    state = EpochState(policy or EpochPolicy(epoch=2, shards=8))
    state.handle(Opened(todo))
    return state


def kinds(out: list[Instruction]) -> list[str]:
    return [type(i).__name__ for i in out if not isinstance(i, Say)]


def said(out: list[Instruction]) -> list[str]:
    return [i.message for i in out if isinstance(i, Say)]


# -- opening (and recovery after a dead driver) --------------------------------------


def test_opening_submits_every_open_subtask_once() -> None:
    state = EpochState(EpochPolicy(epoch=0, shards=3))
    out = state.handle(Opened(((0, 0), (0, 1), (0, 2), (0, 1))))
    assert out == [Submit((0, 0), 1), Submit((0, 1), 1), Submit((0, 2), 1)]
    assert state.in_flight == {(0, 0), (0, 1), (0, 2)} and not state.finished


def test_recovery_gives_up_on_stranded_attempts_and_merges_leftovers_untrained() -> None:
    state = EpochState(EpochPolicy(epoch=1, shards=4))
    stranded = (a(1, "running", key=(1, 0)), a(1, "running", key=(0, 3)))
    left = (a(1, "finished", key=(1, 1)), a(2, "interrupted", key=(1, 1)))
    elsewhere = a(1, "finished", key=(0, 7))  # a subtask that is not open: not merged again
    out = state.handle(Opened(((1, 0), (1, 1), (1, 2)), stranded, (*left, elsewhere), merged=1))
    assert out[0] == Abandon(stranded, "killed", "lost with a previous driver or its cluster")
    assert [i for i in out if isinstance(i, Merge)] == [Merge((1, 1), left[0].id)]
    assert [i for i in out if isinstance(i, Submit)] == [Submit((1, 0), 1), Submit((1, 2), 1)]
    assert state.tally["killed"] == 2 and state.merged == 1


@pytest.mark.parametrize("kind", ["rejected", "skipped"])
def test_a_leftover_that_cannot_be_merged_is_trained_now(kind: str) -> None:
    state = EpochState(EpochPolicy(epoch=0, shards=1))
    left = a(1, "finished", key=(0, 0))
    state.handle(Opened(((0, 0),), leftovers=(left,)))
    out = state.handle(MergeDone((0, 0), left.id, kind, reason="NaN"))  # type: ignore[arg-type]
    assert kinds(out) == ["Note", "Submit"] and out[-1] == Submit((0, 0), 1)
    assert out[-2] == Note((0, 0), "reissue", f"{kind}: NaN (left by a previous driver)")


def test_an_early_start_submits_and_the_opening_after_the_barrier_adds_nothing_twice() -> None:
    """cluster.overlap_epochs: a fresh epoch's shards go out in the previous one's tail;
    at its barrier the opening finds them running (or finished) and leaves them to
    their tasks, and only what else is open (a deferred shard) is submitted."""
    state = EpochState(EpochPolicy(epoch=3, shards=2))
    out = state.handle(StartEarly(((3, 0), (3, 1), (3, 0))))
    assert out == [Submit((3, 0), 1), Submit((3, 1), 1)]
    assert state.early and not state.opened and not state.finished
    state.validate_state()
    # At the barrier: (3, 0) trained and finished meanwhile, (3, 1) still runs, (1, 4)
    # was deferred by an earlier epoch, and an attempt of (2, 6) a dead driver left.
    mine = (a(1, "running", key=(3, 1)),)
    left = a(1, "finished", key=(3, 0))
    dead = a(1, "running", key=(2, 6))
    out = state.handle(Opened(((3, 0), (3, 1), (1, 4)), (*mine, dead), (left,)))
    assert [i for i in out if isinstance(i, Abandon)] == [
        Abandon((dead,), "killed", "lost with a previous driver or its cluster")
    ]
    assert [i for i in out if isinstance(i, Submit | Merge)] == [Submit((1, 4), 1)]
    state.validate_state()
    # Its own result comes in through its task, as any result does.
    out = state.handle(TaskReturned((3, 0), "finished", (left,), attempt_id=left.id))
    assert out == [Merge((3, 0), left.id)]


def test_an_early_start_is_refused_after_opening_and_for_a_pinned_base() -> None:
    with pytest.raises(RuntimeError, match="started early after it started"):
        opened().handle(StartEarly((K,)))
    pinned = EpochState(EpochPolicy(epoch=2, shards=8, pins_base=True))
    with pytest.raises(RuntimeError, match="pins the epoch's base"):
        pinned.handle(StartEarly((K,)))


def test_an_epoch_opens_once() -> None:
    state = opened()
    with pytest.raises(RuntimeError, match="opened twice"):
        state.handle(Opened((K,)))


# -- results ---------------------------------------------------------------------------


def test_a_result_is_merged_and_the_epoch_reaches_its_barrier() -> None:
    state = opened()
    done = a(1, "finished", 100)
    out = state.handle(TaskReturned(K, "finished", (done,), attempt_id=done.id))
    assert out == [Merge(K, done.id)]
    assert not state.finished  # the merge is in progress
    out = state.handle(MergeDone(K, done.id, "merged", version=7, alpha=0.3, staleness=1))
    assert said(out) == ["epoch 2 shard 5 merged as v7 (alpha 0.300, staleness 1)"]
    assert state.finished and state.closed == {K: "merged"} and state.merged == 1


def test_attempts_dask_re_ran_elsewhere_are_killed_when_the_result_comes() -> None:
    state = opened()
    first, second = a(1, "running"), a(2, "finished", 100)
    out = state.handle(TaskReturned(K, "finished", (first, second), attempt_id=second.id))
    assert out == [
        Abandon((first,), "killed", "worker died; the task was re-run elsewhere"),
        Merge(K, second.id),
    ]


def test_a_task_that_found_its_subtask_finished_changes_nothing() -> None:
    state = opened()
    assert state.handle(TaskReturned(K, "skipped", ())) == []
    assert state.tally["skipped"] == 1 and state.finished


@pytest.mark.parametrize(
    ("partial", "expected"), [("scale", ["Merge"]), ("discard", ["Reject", "Note", "Submit"])]
)
def test_a_partial_result_is_merged_scaled_or_discarded(partial: str, expected: list[str]) -> None:
    state = opened(EpochPolicy(epoch=2, shards=8, partial=partial))  # type: ignore[arg-type]
    part = a(1, "interrupted", 40)
    out = state.handle(
        TaskReturned(K, "interrupted", (part,), attempt_id=part.id, samples=40, planned_samples=100)
    )
    assert kinds(out) == expected
    if partial == "discard":
        assert out[0] == Reject(
            part.id, "partial result (40/100 samples) discarded by policy fault.partial=discard"
        )
        assert said(out) == [
            "epoch 2 shard 5 reissued: preempted with notice; partial result discarded"
        ]


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("rejected", "rejected: update norm 9 exceeds max_update_norm 1"), ("skipped", "skipped")],
)
def test_a_result_the_merge_refused_is_reissued(kind: str, reason: str) -> None:
    state = opened()
    done = a(1, "finished", 100)
    state.handle(TaskReturned(K, "finished", (done,), attempt_id=done.id))
    why = "update norm 9 exceeds max_update_norm 1" if kind == "rejected" else None
    refused = replace(done, state="rejected" if kind == "rejected" else "killed")
    out = state.handle(MergeDone(K, done.id, kind, reason=why, attempts=(refused,)))  # type: ignore[arg-type]
    assert out[-1] == Submit(K, 2)
    assert f"epoch 2 shard 5 reissued: {reason}" in said(out)


def test_a_duplicate_outcome_closes_the_subtask_quietly() -> None:
    state = opened()
    done = a(1, "finished", 100)
    state.handle(TaskReturned(K, "finished", (done,), attempt_id=done.id))
    assert state.handle(MergeDone(K, done.id, "duplicate")) == []
    assert state.finished and state.tally["duplicate"] == 1


def test_a_merge_outcome_needs_a_merge() -> None:
    with pytest.raises(RuntimeError, match="without a merge in progress"):
        opened().handle(MergeDone(K, "x", "merged"))


# -- lost tasks, hand-backs, deadlines -----------------------------------------------------


def test_a_lost_task_kills_its_running_attempts_and_is_reissued() -> None:
    state = opened()
    dead = a(1, "running", 30)
    out = state.handle(TaskLost(K, "OSError: connection reset", (dead,)))
    assert out == [
        Abandon((dead,), "killed", "worker died"),
        Say(logging.WARNING, "epoch 2 shard 5 reissued: OSError: connection reset"),
        Note(K, "reissue", "OSError: connection reset"),
        Submit(K, 2),
    ]
    assert state.tally["errors"] == 1 and state.tally["killed"] == 1


def test_a_task_dask_gave_up_on_is_marked_crashed_under_its_own_number() -> None:
    state = opened()
    out = state.handle(TaskLost(K, "KilledWorker", (a(1, "running"),), crashed="worker lost: x"))
    assert out[0] == MarkCrashed(K, 1, "worker lost: x") and out[-1] == Submit(K, 2)


def test_a_hand_back_under_notice_is_reissued_as_a_worker_death() -> None:
    state = opened()
    out = state.handle(TaskReturned(K, "handed_back", (), worker="tcp://10.0.0.7:4000"))
    assert said(out) == [
        "epoch 2 shard 5 reissued: handed back untrained by tcp://10.0.0.7:4000, "
        "under preemption notice"
    ]
    assert state.handed_back == {K: 1} and state.tally["errors"] == 1
    # What no attempt row shows, for the ledger (flows/epoch.py records it): the worker
    # that handed the task back, then the reissue with its reason.
    reason = "handed back untrained by tcp://10.0.0.7:4000, under preemption notice"
    assert [i for i in out if isinstance(i, Note)] == [
        Note(K, "handed_back", "untrained, under preemption notice", "tcp://10.0.0.7:4000"),
        Note(K, "reissue", reason),
    ]
    assert kinds(out) == ["Note", "Note", "Submit"]


def test_a_new_driver_notes_why_it_trains_a_subtask_again() -> None:
    state = EpochState(EpochPolicy(epoch=0, shards=2))
    stranded = a(1, "running", key=(0, 1))
    out = state.handle(Opened(((0, 0), (0, 1)), stranded=(stranded,)))
    notes = [i for i in out if isinstance(i, Note)]
    assert notes == [Note((0, 1), "reissue", "its attempt was lost with a previous driver")]
    assert out.index(notes[0]) == out.index(Submit((0, 1), 1)) - 1  # recorded before it goes


def test_the_fault_free_path_notes_nothing() -> None:
    state = EpochState(EpochPolicy(epoch=0, shards=2))
    out = state.handle(Opened(((0, 0), (0, 1))))
    done = a(1, "finished", key=(0, 0))
    out += state.handle(TaskReturned((0, 0), "finished", (done,), attempt_id=done.id))
    out += state.handle(MergeDone((0, 0), done.id, "merged", version=1, alpha=1.0, staleness=0))
    assert not [i for i in out if isinstance(i, Note)]


def test_an_attempt_past_its_deadline_is_cancelled_and_reissued() -> None:
    state = opened()
    late = a(1, "running", 10)
    out = state.handle(DeadlinePassed(K, (late,), (late,)))
    assert out[:2] == [
        Cancel(K, 1, "attempt past its deadline"),
        Abandon((late,), "timeout", "past its deadline"),
    ]
    assert said(out) == ["epoch 2 shard 5 reissued: timeout after 900s"]
    assert out[-1] == Submit(K, 2) and state.tally["timeouts"] == 1


def test_news_of_a_task_given_up_on_changes_nothing() -> None:
    state = opened()
    late = a(1, "running")
    state.handle(DeadlinePassed(K, (late,), (late,)))
    state.handle(TaskReturned(K, "finished", (a(2, "finished"),), attempt_id="a2"))
    # The reissued task is what is in flight now; the old one's result came late.
    assert state.in_flight == set() and state.merging == {K: False}
    state.handle(MergeDone(K, "a2", "merged"))
    assert state.handle(TaskLost(K, "late news", ())) == []


# -- the attempt budget ------------------------------------------------------------------


def test_attempts_that_trained_count() -> None:
    state = opened()
    state.submitted[K] = 4
    rows = (a(1, "failed"), a(2, "failed"), a(3, "failed"), a(4, "running"))
    out = state.handle(TaskLost(K, "worker died", rows))
    assert kinds(out) == ["Abandon", "Close"]
    assert out[1] == Close(K, "failed", "4 attempts, last: worker died")
    assert said(out) == ["epoch 2 shard 5 failed for good: worker died"]
    assert state.finished and state.closed == {K: "failed"}


def test_kills_that_moved_the_subtask_forward_do_not_fail_it() -> None:
    # Six kills, each after checkpointing further: a healthy subtask on a busy fleet.
    rows = tuple(a(i + 1, "killed", 100 * (i + 1)) for i in range(6))
    state = opened()
    state.submitted[K] = 2
    out = state.handle(TaskLost(K, "KilledWorker: the workers running it died", rows))
    assert out[-1] == Submit(K, 3) and state.tally["failed"] == 0


def test_kills_at_the_same_point_fail_it_and_say_so() -> None:
    # One kill moved it forward; four more died at the same checkpoint.
    rows = (a(1, "killed", 100), *(a(i, "killed", 100) for i in range(2, 6)))
    state = opened()
    state.submitted[K] = 2
    out = state.handle(TaskLost(K, "KilledWorker: the workers running it died", rows))
    assert out[0] == Close(
        K,
        "failed",
        "4 attempts (1 more moved it forward before their workers died), "
        "last: KilledWorker: the workers running it died",
    )


def test_hand_backs_from_workers_under_notice_are_not_attempts() -> None:
    # One attempt trained and died; then five tasks met workers under notice.
    state = opened()
    died = a(1, "killed")
    state.handle(TaskLost(K, "worker died", (died,)))
    for _ in range(5):
        out = state.handle(TaskReturned(K, "handed_back", (died,), worker="w"))
        assert kinds(out)[-1] == "Submit"
    assert state.tally["failed"] == 0 and state.tally["reissued"] == 6


def test_hand_backs_count_once_they_spin() -> None:
    """Workers that never leave the pool must not make a subtask reissue forever."""
    state = opened()
    while not state.closed:
        assert state.submitted[K] < 100, "reissued without end"
        state.handle(TaskReturned(K, "handed_back", (), worker="w"))
    assert state.submitted[K] == FREE_HANDBACKS + 4  # fault.max_attempts
    assert state.closed == {K: "failed"}


@given(st.lists(st.tuples(st.sampled_from(["killed", "failed", "timeout"]), st.integers(0, 500))))
def test_free_attempts_are_the_kills_that_moved_forward(rows: list[tuple[str, int]]) -> None:
    attempts = [a(n, s, samples) for n, (s, samples) in enumerate(rows, 1)]
    free = free_attempts(attempts)
    assert 0 <= free <= sum(1 for s, _ in rows if s == "killed")
    # Progress is bounded: each free attempt reached strictly further.
    assert free <= len({samples for _, samples in rows if samples > 0})


# -- the quorum ----------------------------------------------------------------------------


@pytest.mark.parametrize(("late", "closed"), [("reissue", "deferred"), ("drop", "dropped")])
def test_stragglers_past_the_quorum_deadline_are_deferred_or_dropped(
    late: str, closed: str
) -> None:
    policy = EpochPolicy(epoch=0, shards=4, quorum=0.5, straggler_timeout=60, late=late)  # type: ignore[arg-type]
    state = EpochState(policy)
    keys = tuple((0, s) for s in range(4))
    state.handle(Opened(keys))
    for key in keys[:2]:
        done = a(1, "finished", key=key)
        state.handle(TaskReturned(key, "finished", (done,), attempt_id=done.id))
        state.handle(MergeDone(key, done.id, "merged"))
    assert state.handle(Tick(100.0)) == []  # the quorum is reached: the clock starts
    assert state.handle(Tick(159.0)) == []
    out = state.handle(Tick(160.0))
    assert kinds(out) == ["Cancel", "AbandonRunning", "Close"] * 2
    assert out[2] == Close((0, 2), closed, "late: quorum policy")  # type: ignore[arg-type]
    assert said(out) == [f"epoch 0 closed at quorum: stragglers {late}"]
    assert state.finished and state.tally[closed] == 2


@pytest.mark.parametrize("policy", [{"quorum": 1.0}, {"quorum": 0.25, "final": True}])
def test_no_quorum_deadline_without_a_quorum_or_in_the_last_epoch(
    policy: dict[str, object],
) -> None:
    state = EpochState(EpochPolicy(epoch=0, shards=4, straggler_timeout=1, **policy))  # type: ignore[arg-type]
    state.handle(Opened(((0, 0), (0, 1)), merged=3))
    assert state.handle(Tick(0.0)) == state.handle(Tick(1e6)) == []
    assert state.in_flight == {(0, 0), (0, 1)}


# -- settling after the barrier -----------------------------------------------------------


def test_settling_records_late_duplicates_and_drops_dead_checkpoints() -> None:
    row = SimpleNamespace
    attempts = [
        row(id="dup", subtask_id=1, state="finished", result_uri="r/dup", checkpoint_uri=None),
        row(id="won", subtask_id=1, state="merged", result_uri=None, checkpoint_uri=None),
        row(id="ck", subtask_id=2, state="killed", result_uri=None, checkpoint_uri="r/ck"),
        row(id="open", subtask_id=3, state="killed", result_uri=None, checkpoint_uri="r/open"),
    ]
    subtasks = [row(id=1, state="merged"), row(id=2, state="failed"), row(id=3, state="deferred")]
    assert settle(attempts, subtasks) == [RecordDuplicate("dup", "r/dup"), DropCheckpoint("ck")]


def test_settling_rejects_late_results_of_subtasks_closed_without_a_merge() -> None:
    """A result that came in after its subtask was dropped at the straggler deadline, or
    failed for good, is merged by nothing: it is waste, not a result waiting for a merge."""
    row = SimpleNamespace
    attempts = [
        row(id="late", subtask_id=1, state="finished", result_uri="r/late", checkpoint_uri=None),
        row(id="part", subtask_id=2, state="interrupted", result_uri="r/part", checkpoint_uri="c"),
        row(id="wait", subtask_id=3, state="finished", result_uri="r/wait", checkpoint_uri=None),
    ]
    subtasks = [row(id=1, state="dropped"), row(id=2, state="failed"), row(id=3, state="running")]
    assert settle(attempts, subtasks) == [
        RecordLate("late", "r/late", "dropped"),
        DropCheckpoint("part"),
        RecordLate("part", "r/part", "failed"),
    ]


# -- what the executor used to decide ------------------------------------------------------


def _returned(state: EpochState, key: Key, n: int = 1) -> list[Instruction]:
    """Hand the state a finished result of ``key``."""
    row = a(n, "finished", 100, key=key)
    return state.handle(TaskReturned(key, "finished", (row,), attempt_id=row.id, samples=100))


def test_results_wait_to_be_folded_and_go_together_never_across_an_epoch() -> None:
    state = EpochState(EpochPolicy(epoch=3, shards=4, fold=2))
    keys = [(2, 0), (3, 0), (3, 1), (3, 2)]  # (2, 0) deferred from epoch 2
    state.handle(Opened(tuple(keys)))
    for key in keys:
        assert _returned(state, key) == []  # waiting
    assert not state.gathering  # a fold's worth and more is in
    out = state.handle(Gathered())
    ids = {k: a(1, "x", key=k).id for k in keys}
    assert out == [
        MergeGroup((((2, 0), ids[(2, 0)]),)),
        MergeGroup((((3, 0), ids[(3, 0)]), ((3, 1), ids[(3, 1)]))),
        MergeGroup((((3, 2), ids[(3, 2)]),)),
    ]
    assert state.waiting == [] and state.handle(Gathered()) == []


def test_without_fold_a_result_is_merged_at_once() -> None:
    state = opened()
    assert kinds(_returned(state, K)) == ["Merge"] and not state.waiting


@pytest.mark.parametrize(
    ("every", "retention", "prunes"), [(1, True, 3), (2, True, 1), (2, False, 0)]
)
def test_retention_runs_once_per_so_many_merges(every: int, retention: bool, prunes: int) -> None:
    keys = [(0, s) for s in range(3)]
    state = EpochState(EpochPolicy(epoch=0, shards=3, prune_every=every, retention=retention))
    state.handle(Opened(tuple(keys), unevaluated=(-1, 7)))
    seen: list[Prune] = []
    for key in keys:
        (merge,) = [i for i in _returned(state, key, 1) if isinstance(i, Merge)]
        out = state.handle(MergeDone(key, merge.attempt_id, "merged", version=1))
        seen += [i for i in out if isinstance(i, Prune)]
    # The version evaluated in the background is held meanwhile.
    assert seen == [Prune(frozenset({7}))] * prunes


def test_a_rule_that_pins_the_base_trains_every_shard_of_the_epoch_from_it() -> None:
    state = EpochState(EpochPolicy(epoch=3, shards=2, pins_base=True))
    out = state.handle(Opened(((2, 1), (3, 0), (3, 1)), head=9, first_merged=6))
    # Resumed after v6 was merged from this epoch: the base was v5; a deferred shard of
    # epoch 2 trains from the head at its claim.
    assert [i for i in out if isinstance(i, Submit)] == [
        Submit((2, 1), 1, None),
        Submit((3, 0), 1, 5),
        Submit((3, 1), 1, 5),
    ]
    fresh = EpochState(EpochPolicy(epoch=3, shards=1, pins_base=True))
    assert Submit((3, 0), 1, 9) in fresh.handle(Opened(((3, 0),), head=9))
    unpinned = EpochState(EpochPolicy(epoch=3, shards=1))
    assert Submit((3, 0), 1, None) in unpinned.handle(Opened(((3, 0),), head=9))


def test_the_previous_barrier_is_evaluated_in_the_background_as_the_epoch_opens() -> None:
    state = EpochState(EpochPolicy(epoch=4, shards=1, eval_device="cpu"))
    out = state.handle(Opened(((4, 0),), unevaluated=(3, 12)))
    assert out[0] == Evaluate(3, 12, "cpu", background=True)
    assert state.evaluating == {12}


@pytest.mark.parametrize("final", [False, True])
def test_the_barrier_settles_evaluates_the_last_epoch_prunes_and_advances(final: bool) -> None:
    state = EpochState(EpochPolicy(epoch=4, shards=1, final=final))
    state.handle(Opened(((4, 0),), unevaluated=(3, 12)))
    (merge,) = [i for i in _returned(state, (4, 0)) if isinstance(i, Merge)]
    state.handle(MergeDone((4, 0), merge.attempt_id, "merged", version=13))
    out = state.handle(AtBarrier())
    assert out == [
        AwaitEvaluation(),
        Settle(),
        *([Evaluate(4, None, "auto")] if final else []),
        Prune(frozenset()),  # nothing held any more
        Advance(4),
    ]
    with pytest.raises(RuntimeError, match="not at its barrier"):
        state.handle(AtBarrier())


def test_an_epoch_with_nothing_merged_fails_at_its_barrier() -> None:
    state = EpochState(EpochPolicy(epoch=2, shards=1, max_attempts=1))
    state.handle(Opened(((2, 0),)))
    out = state.handle(TaskLost((2, 0), "boom", (a(1, "failed", key=(2, 0)),)))
    assert kinds(out) == ["Close"]  # failed for good
    assert state.handle(AtBarrier()) == [FailEpoch(2)]


def test_the_barrier_comes_only_when_nothing_is_left() -> None:
    state = opened()
    with pytest.raises(RuntimeError, match="not at its barrier"):
        state.handle(AtBarrier())


def test_the_story_of_a_subtask_is_what_concerned_it() -> None:
    state = EpochState(EpochPolicy(epoch=2, shards=2))
    state.handle(Opened(((2, 0), K)))
    _returned(state, (2, 0))
    state.handle(TaskLost(K, "worker died", (a(1, "running"),)))
    story = state.story(K)
    assert [type(e).__name__ for e, _ in story] == ["Opened", "TaskLost"]
    assert Submit(K, 2) in story[1][1]
    state.validate_state()


def test_validate_state_finds_a_broken_invariant() -> None:
    state = opened()
    state.closed[K] = "merged"  # closed while its task is in flight
    with pytest.raises(AssertionError, match="in flight and closed"):
        state.validate_state()


# -- random event orders -------------------------------------------------------------------


@dataclass
class World:
    """The ledger and the cluster as far as the epoch can see them."""

    state: EpochState
    rows: dict[Key, list[AttemptFact]]
    subtask: dict[Key, str]
    merge_ok: deque[bool]
    live: list[tuple[Key, int]] = field(default_factory=list)
    merges: Counter[Key] = field(default_factory=Counter)
    handbacks: Counter[Key] = field(default_factory=Counter)
    submissions: Counter[Key] = field(default_factory=Counter)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    bases: list[tuple[Key, int | None]] = field(default_factory=list)
    groups: list[tuple[tuple[Key, str], ...]] = field(default_factory=list)
    prunes: list[frozenset[int]] = field(default_factory=list)
    evaluations: list[Evaluate] = field(default_factory=list)
    barrier: list[Instruction] = field(default_factory=list)

    @property
    def policy(self) -> EpochPolicy:
        return self.state.policy

    def attempt(self, key: Key, state: str, samples: int | None = None) -> AttemptFact:
        rows = self.rows[key]
        row = AttemptFact(f"x{next(self.ids)}", key, len(rows) + 1, state, samples)
        rows.append(row)
        if self.subtask[key] not in TERMINAL_SUBTASK_STATES:
            self.subtask[key] = "running"
        return row

    def set(self, attempt_id: str, state: str) -> AttemptFact:
        for rows in self.rows.values():
            for i, row in enumerate(rows):
                if row.id == attempt_id:
                    rows[i] = replace(row, state=state)
                    return row
        raise KeyError(attempt_id)

    def tries(self, key: Key) -> int:
        """The budget's count, computed from the world's own records."""
        free = free_attempts(self.rows[key])
        untrained = min(self.handbacks[key], FREE_HANDBACKS)
        return max(len(self.rows[key]) - free, self.submissions[key] - untrained - free)

    def handle(self, event: Event) -> list[Instruction]:
        out = self.state.handle(event)
        self.state.validate_state()  # after every event, as dask's worker state machine
        return out

    def feed(self, event: Event, gathered: bool = True) -> None:
        """As the executor (flows/epoch.py) does: each instruction carried out, the events it
        makes handed back, and waiting merges let go once nothing more is being handed in."""
        todo = deque(self.handle(event))
        while True:
            while todo:
                for follow in self.do(todo.popleft()):
                    todo.extend(self.handle(follow))
            if not (gathered and self.state.waiting):
                break
            todo.extend(self.handle(Gathered()))

    def do(self, ins: Instruction) -> list[Event]:
        match ins:
            case MergeGroup(items):
                assert 1 <= len(items) <= self.policy.fold, items
                assert len({k[0] for k, _ in items}) == 1, "a fold across an epoch's end"
                self.groups.append(items)
                return [e for k, i in items for e in self.do(Merge(k, i))]
            case Prune(hold):
                assert self.policy.retention
                self.prunes.append(hold)
            case Evaluate():
                self.evaluations.append(ins)
            case AwaitEvaluation() | Settle() | FailEpoch() | Advance():
                self.barrier.append(ins)
            case Submit(key, number, base):
                self.bases.append((key, base))
                assert self.subtask[key] not in TERMINAL_SUBTASK_STATES, "a finished subtask"
                if number > 1:  # a reissue: the budget allowed it
                    assert self.tries(key) < self.policy.max_attempts, (key, self.rows[key])
                assert number == self.submissions[key] + 1
                assert all(k != key for k, _ in self.live), f"{key} submitted while in flight"
                self.submissions[key] += 1
                self.live.append((key, number))
            case Merge(key, attempt_id):
                row = self.set(attempt_id, "merged")
                assert row.state in MERGEABLE_ATTEMPT_STATES
                assert self.subtask[key] != "merged", "merged twice"
                ok = self.merge_ok.popleft() if self.merge_ok else True
                if not ok:
                    self.set(attempt_id, "rejected")
                    return [
                        MergeDone(
                            key, attempt_id, "rejected", "bad", attempts=tuple(self.rows[key])
                        )
                    ]
                self.merges[key] += 1
                self.subtask[key] = "merged"
                return [MergeDone(key, attempt_id, "merged", version=sum(self.merges.values()))]
            case Abandon(attempts, state):
                for row in attempts:
                    if self.current(row.id) == "running":
                        self.set(row.id, state)
            case AbandonRunning(key):
                for row in list(self.rows[key]):
                    if row.state == "running":
                        self.set(row.id, "killed")
            case Reject(attempt_id):
                assert self.current(attempt_id) in MERGEABLE_ATTEMPT_STATES
                self.set(attempt_id, "rejected")
            case Close(key, state):
                assert self.subtask[key] not in TERMINAL_SUBTASK_STATES
                if state == "failed":  # not before the budget is spent
                    assert self.tries(key) >= self.policy.max_attempts, (key, self.rows[key])
                self.subtask[key] = state
            case Cancel(key, number):
                self.live.remove((key, number))
            case MarkCrashed(key, number):
                assert (key, number) not in self.live and number == self.submissions[key]
        return []

    def current(self, attempt_id: str) -> str:
        return next(r.state for rows in self.rows.values() for r in rows if r.id == attempt_id)

    def finish(self, key: Key, kind: str, samples: int) -> Event:
        """What the executor would hand in when the key's task ends as ``kind``."""
        planned = 100
        if kind == "finished":
            row = self.attempt(key, "finished", planned)
        elif kind == "rerun":  # a worker died, Dask re-ran the task: two rows
            self.attempt(key, "running", samples)
            row = self.attempt(key, "finished", planned)
        elif kind == "interrupted":
            row = self.attempt(key, "interrupted", samples)
        elif kind == "handed_back":
            self.handbacks[key] += 1
            return TaskReturned(key, "handed_back", tuple(self.rows[key]), worker="w")
        else:
            if kind != "lost_before_claim":
                self.attempt(key, "running", samples)
            crashed = "worker lost" if kind == "crashed" else None
            return TaskLost(key, kind, tuple(self.rows[key]), crashed=crashed)
        return TaskReturned(
            key,
            row.state,  # type: ignore[arg-type]
            tuple(self.rows[key]),
            attempt_id=row.id,
            samples=row.samples or 0,
            planned_samples=planned,
        )


OUTCOMES = [
    "finished",
    "rerun",
    "interrupted",
    "handed_back",
    "lost",
    "crashed",
    "lost_before_claim",
]
ACTIONS = st.one_of(
    st.tuples(st.just("task"), st.integers(0, 50), st.sampled_from(OUTCOMES), st.integers(0, 99)),
    st.tuples(st.just("deadline"), st.integers(0, 50), st.just(""), st.integers(0, 99)),
    st.tuples(st.just("tick"), st.just(0), st.just(""), st.integers(0, 100)),
    st.tuples(st.just("late_result"), st.integers(0, 50), st.just(""), st.just(0)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shards=st.integers(1, 6),
    policy=st.fixed_dictionaries(
        {
            "max_attempts": st.integers(1, 4),
            "partial": st.sampled_from(["scale", "discard"]),
            "quorum": st.sampled_from([1.0, 0.5]),
            "late": st.sampled_from(["reissue", "drop"]),
            "final": st.booleans(),
            "fold": st.integers(1, 3),
            "prune_every": st.integers(1, 3),
            "retention": st.booleans(),
            "pins_base": st.booleans(),
        }
    ),
    deferred=st.booleans(),
    early=st.booleans(),
    head=st.integers(0, 20),
    first_merged=st.one_of(st.none(), st.integers(1, 20)),
    unevaluated=st.booleans(),
    left_by_a_dead_driver=st.lists(st.sampled_from(["", "finished", "running"]), max_size=6),
    merge_ok=st.lists(st.booleans(), max_size=40),
    actions=st.lists(ACTIONS, max_size=80),
)
def test_in_any_order_no_subtask_is_merged_twice_none_is_lost_and_the_budget_holds(
    shards: int,
    policy: dict[str, object],
    deferred: bool,
    early: bool,
    head: int,
    first_merged: int | None,
    unevaluated: bool,
    left_by_a_dead_driver: list[str],
    merge_ok: list[bool],
    actions: list[tuple[str, int, str, int]],
) -> None:
    # A shard deferred from epoch 2 joins epoch 3's (so folds meet an epoch's end).
    keys = [(2, 0)] * deferred + [(3, s) for s in range(shards)]
    world = World(
        EpochState(EpochPolicy(epoch=3, shards=shards, straggler_timeout=30, **policy)),  # type: ignore[arg-type]
        rows={k: [] for k in keys},
        subtask=dict.fromkeys(keys, "pending"),
        merge_ok=deque(merge_ok),
    )
    # cluster.overlap_epochs: a fresh epoch's shards go out in the previous one's tail
    # (never with a pinned base, nor for an epoch a dead driver left rows of), and are
    # claimed before the barrier opens the epoch: their running rows are this driver's.
    early = early and not policy["pins_base"]
    for key, left in zip(keys, left_by_a_dead_driver, strict=False):
        if left and not (early and key[0] == 3):
            world.attempt(key, left, 50)
    if early:
        world.feed(StartEarly(tuple(k for k in keys if k[0] == 3)))
        for key, _ in world.live:
            world.attempt(key, "running", 10)
    every = [r for rows in world.rows.values() for r in rows]
    world.feed(
        Opened(
            tuple(keys),
            stranded=tuple(r for r in every if r.state == "running"),
            leftovers=tuple(r for r in every if r.state == "finished"),
            head=head,
            first_merged=first_merged,
            unevaluated=(2, head) if unevaluated else None,
        )
    )
    clock = 0.0
    for kind, pick, outcome, amount in actions:
        if kind == "tick":
            clock += amount
            world.feed(Tick(clock))
        elif kind == "late_result":  # an attempt given up on finishes after all
            given_up = [r for rows in world.rows.values() for r in rows if r.state == "killed"]
            if given_up:
                world.set(given_up[pick % len(given_up)].id, "finished")
        elif world.live:
            key, number = world.live[pick % len(world.live)]
            if kind == "deadline":
                late = world.attempt(key, "running", amount)
                world.feed(DeadlinePassed(key, (late,), tuple(world.rows[key])))
            else:
                world.live.remove((key, number))
                world.feed(world.finish(key, outcome, amount))
        world.feed(Tick(clock))
    # Calm: every task left succeeds, and time runs on.
    world.merge_ok.clear()
    for _ in range(10_000):
        if world.state.finished:
            break
        if world.live:
            key, _ = world.live.pop(0)
            world.feed(world.finish(key, "finished", 100))
        clock += 1000.0
        world.feed(Tick(clock))
    assert world.state.finished
    world.feed(AtBarrier())
    p = world.policy
    merged_here = sum(1 for k in keys if k[0] == 3 and world.subtask[k] == "merged")
    # The barrier: the background evaluation awaited first, then failure or the rest.
    expect: list[type] = [AwaitEvaluation] if unevaluated else []
    expect += [FailEpoch] if merged_here == 0 else [Settle, Advance]
    assert [type(i) for i in world.barrier] == expect
    # Evaluations: the previous barrier's in the background, the last epoch's at its barrier.
    assert [(e.epoch, e.version, e.background) for e in world.evaluations] == [
        *([(2, head, True)] if unevaluated else []),
        *([(3, None, False)] if p.final and merged_here else []),
    ]
    # Retention: once per prune_every merges, holding the version being evaluated, and at
    # the barrier; never with retention off.
    merged_total = sum(world.merges.values())
    mid = world.prunes[:-1] if p.retention and merged_here else world.prunes
    assert len(mid) == (merged_total // p.prune_every if p.retention else 0)
    assert all(h <= ({head} if unevaluated else set()) for h in mid)
    if p.retention and merged_here:
        assert world.prunes[-1] == frozenset()
    # Folds: of one epoch, at most `fold` results (checked in do); one at a time without.
    assert all(len(g) == 1 for g in world.groups) or p.fold > 1
    # The pinned base: every shard of this epoch trains from it; a deferred one from the head.
    pinned = (first_merged - 1 if first_merged is not None else head) if p.pins_base else None
    assert all(b == (pinned if k[0] == 3 else None) for k, b in world.bases)
    # The story of a subtask: what concerned it, in order.
    story = world.state.story(keys[-1])
    assert story and isinstance(story[0][0], Opened | StartEarly)
    # None is lost: every subtask is merged, or failed, dropped or deferred by policy.
    assert {world.subtask[k] for k in keys} <= {"merged", "failed", "dropped", "deferred"}
    assert world.state.closed == world.subtask  # and the state machine knows it
    # No subtask merged twice.
    assert all(n <= 1 for n in world.merges.values())
    assert world.state.tally["duplicate"] == 0


# -- a task whose output was lost with its worker: the ledger says what it did -----------


def test_an_unfetchable_output_is_the_newest_mergeable_attempt_of_the_ledger() -> None:
    rows = (a(1, "killed"), a(2, "finished", 40), a(3, "interrupted", 12), a(4, "running"))
    event = recorded_return(K, rows)
    assert event == TaskReturned(K, "interrupted", rows, attempt_id=a(3, "x").id, samples=12)
    # ...and the state machine merges it, abandoning the re-run Dask started.
    state = opened()
    out = state.handle(event)
    assert Merge(K, a(3, "x").id) in out
    assert any(isinstance(i, Abandon) and [f.id for f in i.attempts] == [a(4, "x").id] for i in out)


@pytest.mark.parametrize("states", [(), ("failed",), ("killed", "running"), ("rejected",)])
def test_an_unfetchable_output_with_nothing_mergeable_is_a_lost_task(states: tuple[str]) -> None:
    rows = tuple(a(n, s) for n, s in enumerate(states, 1))
    event = recorded_return(K, rows)
    assert isinstance(event, TaskLost) and event.attempts == rows
    assert "worker left" in event.reason
    state = opened()
    assert Submit(K, 2) in state.handle(event)  # reissued


def test_an_unfetchable_output_ignores_other_subtasks_rows() -> None:
    other = a(1, "finished", key=(2, 6))
    assert isinstance(recorded_return(K, (other,)), TaskLost)

"""The stall report's pure parts: when it is due, and what it says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from flows.epoch_stall import (
    SHOWN_TASKS,
    STALL_FRACTION,
    UNFOLLOWED,
    TaskLook,
    describe_stall,
    stall_due,
)
from vcdl.driver.epoch_events import AttemptFact

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_the_first_report_comes_at_a_quarter_of_the_attempt_timeout() -> None:
    assert STALL_FRACTION == 0.25
    assert not stall_due(224.9, 0, 900.0)
    assert stall_due(225.0, 0, 900.0)
    # Then at twice the wait each time: 450 s, 900 s.
    assert not stall_due(449.0, 1, 900.0) and stall_due(450.0, 1, 900.0)
    assert not stall_due(899.0, 2, 900.0) and stall_due(900.0, 2, 900.0)


@given(
    st.floats(0, 1e6),
    st.integers(0, 30),
    st.floats(1, 1e5),
)
def test_a_report_is_due_at_most_once_per_doubling(
    quiet: float, reports: int, timeout: float
) -> None:
    # Never due again before the wait doubled: a stall of hours logs a few times.
    if stall_due(quiet, reports + 1, timeout):
        assert stall_due(quiet, reports, timeout)
    assert stall_due(quiet, reports, timeout) == (quiet >= timeout / 4 * 2**reports)


def test_the_report_names_each_task_its_attempts_and_its_stack() -> None:
    attempt = AttemptFact(
        "a1",
        (1, 2),
        1,
        "running",
        worker="tcp://10.0.0.2:4001",
        started_at=NOW - timedelta(seconds=300),
    )
    look = TaskLook("processing", "tcp://10.0.0.2:4001", tuple(f"frame {i}" for i in range(20)))
    text = describe_stall(1, 240.0, [((1, 2), 1, look, [attempt]), ((1, 3), 2, None, [])], NOW)
    lines = text.splitlines()
    assert lines[0] == "epoch 1: no result for 240 s; waiting for 2 tasks:"
    assert (
        "epoch 1 shard 2, submission 1: Dask: processing on tcp://10.0.0.2:4001; "
        "attempt 1 running on tcp://10.0.0.2:4001 for 300 s" in lines[1]
    )
    # The innermost frames only, in order.
    assert [line.strip() for line in lines[2:14]] == [f"frame {i}" for i in range(8, 20)]
    assert "epoch 1 shard 3, submission 2: Dask: not asked; no attempt row yet" in lines[14]
    assert "No attempt has claimed" not in text  # one of them has


def test_a_report_where_no_attempt_claimed_says_where_they_wait() -> None:
    look = TaskLook("queued")
    text = describe_stall(0, 600.0, [((0, 0), 1, look, [])], NOW)
    assert "waiting for 1 task:" in text
    assert "Dask: queued; no attempt row yet" in text
    assert "No attempt has claimed its subtask" in text


def test_a_subtask_in_flight_with_no_task_and_an_unanswered_merge_are_named() -> None:
    # Either would hang the drain with nothing in Dask: a driver's bug, said as such.
    text = describe_stall(2, 300.0, [((2, 0), 0, UNFOLLOWED, [])], NOW, merging=[(2, 1)])
    assert text.splitlines()[0] == "epoch 2: no result for 300 s; waiting for 1 task and 1 merge:"
    assert "no task followed by the driver" in text
    assert "epoch 2 shard 1: its merge not answered yet" in text
    assert "No attempt has claimed" not in text


def test_a_report_of_many_tasks_names_twenty_and_counts_the_rest() -> None:
    waiting = [((0, i), 1, TaskLook("queued"), []) for i in range(25)]
    waiting += [((0, 25 + i), 1, None, []) for i in range(5)]
    text = describe_stall(0, 300.0, waiting, NOW)
    assert text.splitlines()[0] == "epoch 0: no result for 300 s; waiting for 30 tasks:"
    named = [line for line in text.splitlines() if ", submission 1: " in line]
    assert len(named) == SHOWN_TASKS == 20
    assert "  and 10 more tasks (5 not asked, 5 queued)" in text.splitlines()

"""Killed attempts that moved their subtask forward do not use up its attempt budget."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from vcdl.budget import free_attempts

STATES = ("killed", "failed", "timeout", "rejected", "finished", "running")


@dataclass(frozen=True)
class A:
    number: int
    state: str
    samples: int | None


def _attempts(rows: list[tuple[str, int | None]]) -> list[A]:
    return [A(i + 1, state, samples) for i, (state, samples) in enumerate(rows)]


def test_kills_that_checkpoint_further_each_time_are_free() -> None:
    rows = _attempts([("killed", 100), ("killed", 250), ("killed", 400)])
    assert free_attempts(rows) == 3


def test_kills_at_the_same_point_count() -> None:
    # Out of memory at one batch: the replacement resumes at 100 and dies there.
    rows = _attempts([("killed", 100), ("killed", 100), ("killed", 100), ("killed", None)])
    assert free_attempts(rows) == 1


def test_only_kills_are_free() -> None:
    rows = _attempts([("failed", 100), ("timeout", 200), ("rejected", 300), ("killed", 250)])
    assert free_attempts(rows) == 0


def test_order_is_by_attempt_number_not_listing() -> None:
    rows = _attempts([("killed", 100), ("killed", 200)])
    assert free_attempts(reversed(rows)) == 2


@given(st.lists(st.tuples(st.sampled_from(STATES), st.none() | st.integers(0, 1000)), max_size=30))
def test_free_attempts_are_kills_that_advanced_the_frontier(
    rows: list[tuple[str, int | None]],
) -> None:
    attempts = _attempts(rows)
    free = free_attempts(attempts)
    kills = sum(1 for a in attempts if a.state == "killed")
    assert 0 <= free <= kills
    # Each free attempt raised the frontier: at most as many as distinct progress levels.
    assert free <= len({a.samples for a in attempts if a.samples})
    # Killed attempts without a checkpoint are never free.
    no_checkpoint = [A(a.number, a.state, None) for a in attempts]
    assert free_attempts(no_checkpoint) == 0

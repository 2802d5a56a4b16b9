"""vcdl.states: the lifecycle tables are consistent, and illegal moves name both states."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vcdl import states
from vcdl.errors import LedgerError
from vcdl.states import (
    ATTEMPT_MOVES,
    ATTEMPT_STATES,
    RUN_MOVES,
    RUN_STATES,
    SUBTASK_MOVES,
    SUBTASK_STATES,
    IllegalTransition,
    check_attempt_move,
    check_subtask_move,
    sources,
)


@pytest.mark.parametrize(
    ("moves", "universe"),
    [(SUBTASK_MOVES, SUBTASK_STATES), (ATTEMPT_MOVES, ATTEMPT_STATES), (RUN_MOVES, RUN_STATES)],
)
def test_every_state_has_its_moves_and_every_move_leads_to_a_state(
    moves: dict[str, frozenset[str]], universe: frozenset[str]
) -> None:
    assert set(moves) == universe
    for targets in moves.values():
        assert targets <= universe


def test_the_named_subsets_are_states() -> None:
    for subset in (states.TERMINAL_SUBTASK_STATES, states.BARRIER_SUBTASK_STATES):
        assert subset <= SUBTASK_STATES
    for subset in (
        states.MERGEABLE_ATTEMPT_STATES,
        states.RESUMABLE_ATTEMPT_STATES,
        states.USEFUL_ATTEMPT_STATES,
        states.PENDING_ATTEMPT_STATES,
        states.WASTE_ATTEMPT_STATES,
    ):
        assert subset <= ATTEMPT_STATES
    assert states.ENDED_RUN_STATES <= RUN_STATES
    # Cost accounting puts every attempt somewhere, and nowhere twice.
    useful, pending, waste = (
        states.USEFUL_ATTEMPT_STATES,
        states.PENDING_ATTEMPT_STATES,
        states.WASTE_ATTEMPT_STATES,
    )
    assert useful | pending | waste == ATTEMPT_STATES
    assert not (useful & pending or useful & waste or pending & waste)


def test_terminal_states_are_final_and_only_the_merge_makes_merged() -> None:
    for s in states.TERMINAL_SUBTASK_STATES:
        assert SUBTASK_MOVES[s] == frozenset()
    assert sources(ATTEMPT_MOVES, "merged") == states.MERGEABLE_ATTEMPT_STATES
    assert sources(SUBTASK_MOVES, "merged") == {"pending", "running", "deferred"}


def test_an_illegal_move_names_both_states() -> None:
    with pytest.raises(IllegalTransition, match="'failed' to 'running'") as info:
        check_subtask_move("failed", "running", "subtask 7")
    assert isinstance(info.value, LedgerError)  # the ledger's error family
    assert "subtask 7" in str(info.value) and "final" in str(info.value)
    with pytest.raises(IllegalTransition, match="'rejected' to 'finished'"):
        check_attempt_move("rejected", "finished")
    with pytest.raises(IllegalTransition, match="unknown attempt state 'lost'"):
        check_attempt_move("running", "lost")


@given(st.lists(st.sampled_from(sorted(ATTEMPT_STATES)), max_size=12))
def test_a_walk_of_legal_attempt_moves_never_leaves_a_final_state(walk: list[str]) -> None:
    state = "running"
    for target in walk:
        if target in ATTEMPT_MOVES[state]:
            state = target
        else:
            with pytest.raises(IllegalTransition):
                check_attempt_move(state, target)
    if state in ("merged", "rejected", "duplicate", "failed"):
        assert ATTEMPT_MOVES[state] == frozenset()

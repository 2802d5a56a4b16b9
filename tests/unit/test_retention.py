"""The retention policy (vcdl.driver.retention): ledger facts in, versions to keep out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.config import KeepSection, parse_config
from vcdl.driver.retention import (
    VersionFacts,
    attempt_bases,
    epoch_ends,
    epoch_starts,
    prunable,
    stale_attempt_groups,
    versions_to_keep,
)
from vcdl.errors import ConfigError
from vcdl.ledger import Attempt, Subtask
from vcdl.states import ATTEMPT_STATES, SUBTASK_STATES, TERMINAL_SUBTASK_STATES


@st.composite
def runs(draw: st.DrawFn) -> VersionFacts:
    """A run's versions: v0, then merges whose epochs never go back, a head, bases, best."""
    merges = draw(st.lists(st.integers(0, 3), max_size=40).map(sorted))
    epochs: dict[int, int | None] = {0: None}
    for i, epoch in enumerate(merges, start=1):
        epochs[i] = epoch
    head = len(merges)
    numbers = st.integers(0, head)
    needed = draw(st.frozensets(numbers, max_size=4))
    best = draw(st.none() | numbers)
    open_epochs = draw(st.frozensets(st.integers(0, 4), max_size=2))
    return VersionFacts(epochs, head, needed, best, open_epochs)


policies = st.builds(
    KeepSection,
    all=st.booleans(),
    every=st.integers(0, 5),
    latest=st.integers(0, 5),
)


@given(runs(), policies)
@settings(max_examples=300, deadline=None)
def test_always_kept_and_only_versions(facts: VersionFacts, policy: KeepSection) -> None:
    keep = versions_to_keep(policy, facts)
    assert keep <= set(facts.epochs)
    must = {0, facts.head} | epoch_ends(facts.epochs) | facts.needed
    must |= epoch_starts(facts.epochs, facts.open_epochs)
    if facts.best is not None:
        must.add(facts.best)
    assert must <= keep
    if policy.all:
        assert keep == set(facts.epochs)
    if policy.every:
        assert {n for n in facts.epochs if n % policy.every == 0} <= keep
    if policy.latest:
        assert {n for n in facts.epochs if n > facts.head - policy.latest} <= keep
    pruned = prunable(policy, facts)
    assert set(pruned).isdisjoint(keep) and set(pruned) | keep == set(facts.epochs)


@given(runs())
@settings(max_examples=300, deadline=None)
def test_default_policy_keeps_exactly_the_named_versions(facts: VersionFacts) -> None:
    keep = versions_to_keep(KeepSection(), facts)
    expected = {0, facts.head} | epoch_ends(facts.epochs) | facts.needed
    expected |= epoch_starts(facts.epochs, facts.open_epochs)
    expected |= {facts.best} if facts.best is not None else set()
    assert keep == expected
    # The storage bound of issue 32: epochs + 3 once nothing is in flight.
    epochs_seen = len({e for e in facts.epochs.values() if e is not None})
    extra = len(facts.needed) + len(facts.open_epochs)
    assert len(keep) <= epochs_seen + 3 + extra


@given(runs(), st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_pruning_is_monotone_with_a_growing_run(facts: VersionFacts, more: int) -> None:
    """A version pruned now is never needed later by the default policy's fixed rules:
    once not an epoch end (a newer version of its epoch exists) it never is again."""
    ends = epoch_ends(facts.epochs)
    last_epoch = max((e for e in facts.epochs.values() if e is not None), default=0)
    grown = dict(facts.epochs)
    for i in range(more):
        grown[facts.head + 1 + i] = last_epoch
    later = epoch_ends(grown)
    assert later - ends <= set(range(facts.head + 1, facts.head + 1 + more)) | ends


def test_epoch_ends_of_a_run() -> None:
    # v0; epoch 0: v1-v3; epoch 1: none (every shard dropped); epoch 2: v4-v5.
    epochs = {0: None, 1: 0, 2: 0, 3: 0, 4: 2, 5: 2}
    assert epoch_ends(epochs) == {3, 5}
    assert epoch_ends({0: None}) == {0}
    assert versions_to_keep(KeepSection(), VersionFacts(epochs, 5)) == {0, 3, 5}
    assert versions_to_keep(KeepSection(every=2), VersionFacts(epochs, 5)) == {0, 2, 3, 4, 5}
    assert versions_to_keep(KeepSection(latest=3), VersionFacts(epochs, 5)) == {0, 3, 4, 5}
    assert versions_to_keep(KeepSection(), VersionFacts(epochs, 5, frozenset({1}), 2)) == {
        0,
        1,
        2,
        3,
        5,
    }
    # Epoch 2 still open: the version before its first merge (v3) is its pinned base.
    assert epoch_starts(epochs, {2}) == {3}
    # A base or best that is no version keeps nothing.
    assert versions_to_keep(KeepSection(), VersionFacts(epochs, 5, frozenset({9}), 7)) == {0, 3, 5}


def _sub(sid: int, state: str) -> Subtask:
    return Subtask(id=sid, run="r", epoch=0, shard=sid, state=state)


def _att(
    aid: str, sid: int, state: str, base: int, result: str | None = None, ckpt: str | None = None
) -> Attempt:
    return Attempt(
        id=aid,
        run="r",
        subtask_id=sid,
        epoch=0,
        shard=sid,
        number=1,
        worker="w",
        base_version=base,
        state=state,
        result_uri=result,
        checkpoint_uri=ckpt,
    )


def test_attempt_bases_and_dead_groups() -> None:
    subtasks = [_sub(1, "running"), _sub(2, "merged"), _sub(3, "deferred"), _sub(4, "running")]
    attempts = [
        _att("a", 1, "running", 5),  # in flight
        _att("b", 1, "killed", 4, ckpt="x/ckpt-b"),  # resumable
        _att("c", 1, "killed", 3),  # killed without a checkpoint: nothing to resume
        _att("d", 2, "merged", 2, result="x/res-d", ckpt="x/ckpt-d"),
        _att("e", 2, "running", 1, ckpt="x/ckpt-e"),  # a zombie of a merged subtask
        _att("f", 3, "timeout", 6, ckpt="x/ckpt-f"),  # deferred: may resume later
        _att("g", 4, "finished", 7, result="x/res-g"),  # an unmerged result
        _att("h", 4, "rejected", 8, result="x/res-h"),
    ]
    assert attempt_bases(attempts, subtasks) == {5, 4, 6, 7}
    assert stale_attempt_groups(attempts, subtasks) == {
        "res-d": "d",
        "ckpt-d": "d",
        "ckpt-e": "e",
        "res-h": "h",
    }


@given(
    st.lists(
        st.tuples(
            st.integers(1, 4),
            st.sampled_from(sorted(ATTEMPT_STATES)),
            st.integers(0, 9),
            st.booleans(),
            st.booleans(),
        ),
        max_size=12,
    ),
    st.lists(st.sampled_from(sorted(SUBTASK_STATES)), min_size=4, max_size=4),
)
@settings(max_examples=200, deadline=None)
def test_groups_are_either_needed_or_stale(
    rows: list[tuple[int, str, int, bool, bool]], states: list[str]
) -> None:
    subtasks = [_sub(i + 1, s) for i, s in enumerate(states)]
    attempts = [
        _att(f"a{i}", sid, state, base, f"x/r{i}" if res else None, f"x/c{i}" if ck else None)
        for i, (sid, state, base, res, ck) in enumerate(rows)
    ]
    stale = stale_attempt_groups(attempts, subtasks)
    bases = attempt_bases(attempts, subtasks)
    done = {s.id for s in subtasks if s.state in TERMINAL_SUBTASK_STATES}
    for i, a in enumerate(attempts):
        if a.subtask_id in done:
            # Nothing of a finished subtask is needed: every group it names goes.
            assert (not a.result_uri or f"r{i}" in stale) and (
                not a.checkpoint_uri or f"c{i}" in stale
            )
        elif a.state == "running" or (a.state in ("finished", "interrupted")):
            assert a.base_version in bases
            assert f"r{i}" not in stale


def test_keep_config() -> None:
    cfg = parse_config({"store": {"keep": {"every": 10, "latest": 2}}})
    assert cfg.store.keep == KeepSection(every=10, latest=2)
    assert parse_config({}).store.keep == KeepSection()
    with pytest.raises(ConfigError, match=r"store\.keep\.evry: unknown key"):
        parse_config({"store": {"keep": {"evry": 3}}})
    with pytest.raises(ConfigError, match=r"store\.keep\.every"):
        parse_config({"store": {"keep": {"every": -1}}})

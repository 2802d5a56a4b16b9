"""Retention: which versions keep their weights, and which results and checkpoints go.

This module owns the decision, as pure functions of ledger facts (no I/O):
:func:`versions_to_keep` takes the run's versions, its head, the best
evaluated version and the versions attempts may still read, and returns the
set of version numbers whose groups must stay in the store under a
``store.keep`` policy (:class:`~vcdl.config.KeepSection`). Applying it
(marking the ledger, deleting bytes, crash-safely) is :mod:`vcdl.driver.gc`'s
job.

Who reads which version, and so what is always kept:

* v0: the run's start (warm starts and audits trace lineage to it);
* the head: every merge reads it, every new attempt trains from it, and a
  resumed run continues from it (its merge rule state lives beside it);
* each epoch's last version (the newest of an epoch up to e, the *barrier
  head*): the driver evaluates it after the barrier, while the next epoch's
  merges go on, and a rule that pins every shard of an epoch to one base
  (averaging) starts the next epoch from it;
* the best evaluated version (``retrain --version best``);
* the version an epoch still open started from (a pinned base);
* the base of every attempt that may still be merged or resumed: a running
  attempt trains from it, an unmerged result of a reduced-precision encoding
  is decoded against it, the delta rule subtracts it, and a replacement
  resuming a checkpoint keeps the checkpoint's base.

The bound this gives: at most (epochs + 2) versions once a run has ended
(v0, one per epoch, the best; the head is the last epoch's end, and
nothing is in flight), plus, during it, one per attempt in flight and the
open epochs' starts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from vcdl.config import KeepSection
from vcdl.ledger import Attempt, Subtask
from vcdl.states import MERGEABLE_ATTEMPT_STATES, RESUMABLE_ATTEMPT_STATES, TERMINAL_SUBTASK_STATES


@dataclass(frozen=True)
class VersionFacts:
    """What the policy needs to know of a run's versions.

    ``epochs``: version number -> the epoch of the subtask it merged (None
    for v0 and other non-subtask versions), every version of the run, pruned
    or not. ``needed``: bases of attempts that may still read them
    (:func:`attempt_bases`). ``best``: the best evaluated version, if any.
    ``open_epochs``: epochs with subtasks not done yet, whose attempts may
    still start from the epoch's pinned base (:func:`epoch_starts`).
    """

    epochs: Mapping[int, int | None]
    head: int
    needed: frozenset[int] = frozenset()
    best: int | None = None
    open_epochs: frozenset[int] = frozenset()


def epoch_ends(epochs: Mapping[int, int | None]) -> set[int]:
    """The newest version of an epoch up to e, for every epoch e that has versions.

    For an epoch still being trained this is its newest version so far: it
    may become the epoch's last one, and is kept until a newer one is.
    """
    ends: set[int] = set()
    newest = -1
    by_epoch: dict[int, int] = {}
    for number, epoch in epochs.items():
        if epoch is None:
            newest = max(newest, number)  # v0 (and other non-subtask versions) start every epoch
        else:
            by_epoch[epoch] = max(by_epoch.get(epoch, -1), number)
    for epoch in sorted(by_epoch):
        newest = max(newest, by_epoch[epoch])
        ends.add(newest)
    if not by_epoch and newest >= 0:
        ends.add(newest)
    return ends


def epoch_starts(epochs: Mapping[int, int | None], open_epochs: Collection[int]) -> set[int]:
    """The version each open epoch started from: the one before its first merge.

    A rule that pins every shard of an epoch to one base (averaging) starts
    the epoch's later attempts from it, even after shards of an earlier
    epoch (deferred by the quorum policy) were merged after it. An open
    epoch without merges yet starts from the head, kept anyway.
    """
    first: dict[int, int] = {}
    for number, epoch in epochs.items():
        if epoch is not None and epoch in open_epochs:
            first[epoch] = min(first.get(epoch, number), number)
    return {n - 1 for n in first.values() if n >= 1}


def versions_to_keep(policy: KeepSection, facts: VersionFacts) -> frozenset[int]:
    """The version numbers whose weights stay in the store; every other one may be pruned.

    A subset of ``facts.epochs``: a number that is not a version (a base
    named by a bad row, a best evaluation of a version that never existed)
    keeps nothing.
    """
    numbers = set(facts.epochs)
    if policy.all:
        return frozenset(numbers)
    keep = {0, facts.head} | epoch_ends(facts.epochs) | set(facts.needed)
    keep |= epoch_starts(facts.epochs, facts.open_epochs)
    if facts.best is not None:
        keep.add(facts.best)
    if policy.every:
        keep |= {n for n in numbers if n % policy.every == 0}
    if policy.latest:
        keep |= {n for n in numbers if n > facts.head - policy.latest}
    return frozenset(keep & numbers)


def attempt_bases(attempts: Iterable[Attempt], subtasks: Iterable[Subtask]) -> frozenset[int]:
    """The versions attempts may still read: the bases of those whose subtask is not done
    and that are running, hold an unmerged result or a resumable checkpoint."""
    open_subtasks = {s.id for s in subtasks if s.state not in TERMINAL_SUBTASK_STATES}
    return frozenset(
        a.base_version
        for a in attempts
        if a.subtask_id in open_subtasks
        and (
            a.state == "running"
            or a.state in MERGEABLE_ATTEMPT_STATES
            or (a.state in RESUMABLE_ATTEMPT_STATES and a.checkpoint_uri)
        )
    )


def stale_attempt_groups(
    attempts: Iterable[Attempt], subtasks: Iterable[Subtask]
) -> dict[str, str]:
    """Result and checkpoint groups no attempt can need any more: group name -> attempt id.

    A result is needed while it may still be merged (its attempt finished or
    was interrupted, and its subtask is not done); a checkpoint while a
    replacement may resume it (its attempt is unfinished and its subtask not
    done). Every other group an attempt names is dead weight. Names are the
    last component of the groups' paths (what a store listing gives).
    """
    open_subtasks = {s.id for s in subtasks if s.state not in TERMINAL_SUBTASK_STATES}
    stale: dict[str, str] = {}
    live: set[str] = set()
    for a in attempts:
        alive = a.subtask_id in open_subtasks
        for uri, needed in (
            (a.result_uri, alive and a.state in MERGEABLE_ATTEMPT_STATES | {"running"}),
            (a.checkpoint_uri, alive and a.state in RESUMABLE_ATTEMPT_STATES),
        ):
            if uri:
                name = uri.rstrip("/").rsplit("/", 1)[-1]
                if needed:
                    live.add(name)
                else:
                    stale[name] = a.id
    # A group two attempts name (never written so, but cheap to honour) stays if either needs it.
    return {name: aid for name, aid in stale.items() if name not in live}


def prunable(policy: KeepSection, facts: VersionFacts, pruned: Collection[int] = ()) -> list[int]:
    """The versions to prune now: not kept and not pruned already, oldest first."""
    keep = versions_to_keep(policy, facts)
    return sorted(n for n in facts.epochs if n not in keep and n not in set(pruned))

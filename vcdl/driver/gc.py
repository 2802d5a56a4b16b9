"""Applying the retention policy to a run: mark, delete, report (``vcdl gc``, and during a run).

This module owns the I/O of retention; what to keep is decided by the pure
functions of :mod:`vcdl.driver.retention`. One pass (:func:`collect`):

1. read the facts, in an order that cannot miss a reader: the run and its
   versions first, then the attempts and subtasks, then the evaluations.
   An attempt that starts after the versions were read trains from the
   head of that moment or a newer one: either kept or not yet a candidate;
2. mark the versions to prune in the ledger (``version.pruned_at``), one
   transaction. From then on nothing reads them: export and evaluate refuse
   them, no attempt can start from them (attempts start from the head);
3. delete their groups (and merge rule states stored beside them), plus the
   groups of versions marked by an earlier pass that a kill interrupted;
4. delete the result and checkpoint groups no attempt can need any more.

Crash safety is the order: the ledger's mark precedes the deletion, and a
deletion unpublishes a group before removing its chunks, so a kill at any
point leaves either a kept version with all its bytes, or a pruned version
with some or none of them (what the next pass deletes). Never a version the
ledger offers whose bytes are gone. Every step is idempotent: re-running
finishes the job.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from vcdl.config import RunConfig
from vcdl.driver.retention import (
    VersionFacts,
    attempt_bases,
    prunable,
    stale_attempt_groups,
    versions_to_keep,
)
from vcdl.driver.retrain import pick_version
from vcdl.ledger import Version
from vcdl.objectives import objective_for
from vcdl.runtime import RunRef
from vcdl.states import TERMINAL_SUBTASK_STATES
from vcdl.store.paths import results_prefix, rule_state_path, versions_prefix

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What one pass did (or, with ``dry_run``, would do)."""

    run: str
    dry_run: bool
    kept: list[int] = field(default_factory=list)
    pruned: list[int] = field(default_factory=list)  # marked by this pass
    finished: list[int] = field(default_factory=list)  # pruned earlier, bytes deleted now
    groups: list[str] = field(default_factory=list)  # results and checkpoints deleted
    bytes_freed: int = 0
    store_bytes: int | None = None  # the run's bytes in the store after the pass

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def version_facts(
    ref: RunRef, cfg: RunConfig, hold: Collection[int] = ()
) -> tuple[VersionFacts, list[Version]]:
    """The ledger's facts for the policy, read in the safe order (see the module doc).

    ``hold``: versions the caller is about to read (the driver's evaluation
    of an epoch's barrier head, which a shard deferred by the quorum policy
    and merged meanwhile stops being the epoch's last version).
    """
    ledger = ref.ledger()
    run = ledger.get_run(ref.run)
    versions = ledger.versions(ref.run)
    attempts = ledger.attempts(ref.run)
    subtasks = ledger.subtasks(ref.run)
    evaluations = ledger.evaluations(ref.run)
    objective = objective_for(cfg.train)
    best = (
        pick_version(
            "best",
            run.head_version,
            evaluations,
            metric=objective.headline,
            higher_is_better=objective.higher_is_better,
        )
        if any(e.split == "test" for e in evaluations)
        else None
    )
    facts = VersionFacts(
        epochs={v.number: v.epoch for v in versions},
        head=run.head_version,
        needed=attempt_bases(attempts, subtasks) | frozenset(hold),
        best=best,
        open_epochs=frozenset(s.epoch for s in subtasks if s.state not in TERMINAL_SUBTASK_STATES),
    )
    return facts, versions


def collect(
    ref: RunRef,
    cfg: RunConfig,
    *,
    dry_run: bool = False,
    measure: bool = True,
    hold: Collection[int] = (),
) -> GcReport:
    """One retention pass over run ``ref.run`` under ``cfg.store.keep`` (see the module doc).

    ``measure``: count the bytes freed and the run's bytes left (a listing of
    every object deleted: off for the pass after each merge of a run).
    ``hold``: versions kept whatever the policy says (see :func:`version_facts`).
    """
    ledger, store = ref.ledger(), ref.store()
    facts, versions = version_facts(ref, cfg, hold)
    policy = cfg.store.keep
    report = GcReport(ref.run, dry_run, kept=sorted(versions_to_keep(policy, facts)))
    by_number = {v.number: v for v in versions}
    already = [v.number for v in versions if v.pruned_at is not None]
    to_prune = prunable(policy, facts, already)
    on_store = set(store.list(versions_prefix(ref.run)))
    leftovers = [n for n in already if _name(by_number[n].uri) in on_store]

    # Results and checkpoints: only groups the ledger names as dead, and only
    # those still in the store (a listing, not one lookup per attempt).
    attempts = ledger.attempts(ref.run)
    stale = stale_attempt_groups(attempts, ledger.subtasks(ref.run))
    results = results_prefix(ref.run)
    dead_groups = [f"{results}/{name}" for name in store.list(results) if name in stale]

    def size(path: str) -> int:
        return store.nbytes(path) if measure else 0

    if dry_run:
        report.pruned = to_prune
        report.finished = leftovers
        report.groups = dead_groups
        report.bytes_freed = sum(size(by_number[n].uri) for n in to_prune + leftovers) + sum(
            size(g) for g in dead_groups
        )
        report.store_bytes = store.nbytes(f"runs/{ref.run}") if measure else None
        return report

    # 2. The mark first: from here on nothing reads these versions.
    report.pruned = ledger.mark_pruned(ref.run, to_prune)
    # 3. Their bytes, and those a killed pass left behind.
    for number in [*leftovers, *report.pruned]:
        uri = by_number[number].uri
        freed = size(uri) + size(rule_state_path(ref.run, uri))
        store.delete(uri)
        # A pruned version is never the head again: its rule state is never read.
        store.delete(rule_state_path(ref.run, uri))
        report.bytes_freed += freed
    report.finished = leftovers
    # 4. Results and checkpoints nothing can read any more.
    for path in dead_groups:
        report.bytes_freed += size(path)
        store.delete(path)
    report.groups = dead_groups
    report.store_bytes = store.nbytes(f"runs/{ref.run}") if measure else None
    if report.pruned or report.groups:
        log.debug(
            "run %s: pruned %s, deleted %d result/checkpoint groups",
            ref.run,
            report.pruned,
            len(report.groups),
        )
    return report


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def format_report(report: GcReport) -> str:
    """The human form of a report: a few lines."""
    verb = "would prune" if report.dry_run else "pruned"
    lines = [
        f"gc of {report.run}{' (dry run: nothing changed)' if report.dry_run else ''}: "
        f"{verb} {len(report.pruned)} version(s), "
        f"{'would free' if report.dry_run else 'freed'} {_human(report.bytes_freed)}",
        f"  kept: {_numbers(report.kept)}",
    ]
    if report.pruned:
        lines.append(f"  {verb}: {_numbers(report.pruned)}")
    if report.finished:
        lines.append(f"  bytes of earlier pruned versions deleted: {_numbers(report.finished)}")
    if report.groups:
        lines.append(f"  result/checkpoint groups deleted: {len(report.groups)}")
    if report.store_bytes is not None:
        lines.append(f"  the run's store now holds {_human(report.store_bytes)}")
    return "\n".join(lines)


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(f"v{n}" for n in numbers[:20])
    return shown + (f" (+{len(numbers) - 20} more)" if len(numbers) > 20 else "") or "none"


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError

"""The audit: checks of a run's invariants (docs/design.md §3) on the ledger and store.

Read-only. :func:`audit_run` returns the violations found; an empty list
means the run is sound.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from vcdl.errors import StoreError
from vcdl.ledger import Attempt, Subtask
from vcdl.runtime import RunRef
from vcdl.states import BARRIER_SUBTASK_STATES, MERGEABLE_ATTEMPT_STATES


def audit_run(ref: RunRef, deep: bool = False) -> list[str]:
    """Violations of the run's invariants; an empty list means the run is sound.

    Checks: the head is a complete, checksummed version; the version chain is
    gap-free with lineage recorded; every subtask of a completed epoch was
    merged exactly once or recorded as dropped/failed; merged attempts and
    subtasks agree with the versions; a completed run holds no result
    nobody settled (:func:`unsettled_results`). ``deep`` also verifies every kept
    version's checksums (reads all weights). A version pruned by the retention
    policy keeps its lineage, which is checked as any other; its weights are
    absent by design, never a violation (bytes a killed ``vcdl gc`` left
    behind are deleted by the next one).
    """
    ledger, store = ref.ledger(), ref.store()
    problems: list[str] = []
    run = ledger.get_run(ref.run)
    versions = ledger.versions(ref.run)
    numbers = [v.number for v in versions]
    if numbers != list(range(len(numbers))):
        problems.append(f"version numbers are not 0..{len(numbers) - 1} without gaps: {numbers}")
    if run.head_version != (numbers[-1] if numbers else None):
        problems.append(f"head {run.head_version} is not the newest version {numbers[-1:]}")
    subtasks = {s.id: s for s in ledger.subtasks(ref.run)}
    attempts = {a.id: a for a in ledger.attempts(ref.run)}
    per_subtask: Counter[int] = Counter()
    for v in versions:
        if v.number == 0:
            if v.parent is not None:
                problems.append("v0 has a parent")
            continue
        if v.parent != v.number - 1:
            problems.append(f"v{v.number}: parent {v.parent}, expected {v.number - 1}")
        if v.subtask_id is None or v.attempt_id is None or v.alpha is None or v.staleness is None:
            problems.append(f"v{v.number}: lineage incomplete (subtask, attempt, alpha, staleness)")
            continue
        per_subtask[v.subtask_id] += 1
        att = attempts.get(v.attempt_id)
        if att is None or att.state != "merged":
            problems.append(f"v{v.number}: attempt {v.attempt_id} is not recorded as merged")
        sub = subtasks.get(v.subtask_id)
        if sub is None or sub.state != "merged" or sub.merged_version != v.number:
            problems.append(f"v{v.number}: subtask {v.subtask_id} does not point back to it")
        if v.pruned_at is not None:
            continue  # its weights were let go (store.keep): the lineage above still audits
        if not store.exists(v.uri):
            problems.append(f"v{v.number}: group {v.uri} missing or incomplete in the store")
    for v in versions:
        if v.pruned_at is not None and v.number in (0, run.head_version):
            problems.append(f"v{v.number}: marked pruned, but v0 and the head are always kept")
    for sid, n in per_subtask.items():
        if n > 1:
            s = subtasks[sid]
            problems.append(f"subtask epoch {s.epoch} shard {s.shard} merged {n} times")
    for s in subtasks.values():
        assert s.id is not None  # rows read back from the ledger have ids
        if s.epoch < run.epochs_completed and s.state not in BARRIER_SUBTASK_STATES:
            problems.append(f"epoch {s.epoch} shard {s.shard} is '{s.state}' in a completed epoch")
        if s.state == "merged" and per_subtask[s.id] != 1:
            problems.append(f"epoch {s.epoch} shard {s.shard} is 'merged' without one version")
    if run.state == "completed":
        problems += unsettled_results(attempts.values(), subtasks)
    merged_attempts = Counter(a.subtask_id for a in attempts.values() if a.state == "merged")
    for sid, n in merged_attempts.items():
        if n > 1:
            problems.append(f"subtask {sid} has {n} attempts marked merged")
    if versions:
        check = versions if deep else [v for v in versions if v.number == run.head_version]
        check = [v for v in check if v.pruned_at is None or v.number == run.head_version]
        for v in check:
            try:
                store.read_state(v.uri, verify=True)
                if store.checksum(v.uri) != v.checksum:
                    problems.append(f"v{v.number}: checksum differs from the ledger's")
            except StoreError as exc:
                problems.append(f"v{v.number}: {exc}")
    return problems


def unsettled_results(
    attempts: Iterable[Attempt], subtasks: Mapping[int | None, Subtask]
) -> list[str]:
    """Results of a completed run still waiting for a merge their subtask had from another
    attempt: nobody will record them as duplicates any more.

    The ledger records such a result a duplicate when it comes in
    (vcdl/ledger/work.py), and the driver's settle at each barrier one whose
    subtask was merged after it came in; so only a ledger written by an older
    vcdl, or a settle that went wrong, has them. ``subtasks`` by id.
    """
    problems: list[str] = []
    for a in attempts:
        sub = subtasks.get(a.subtask_id)
        if a.state in MERGEABLE_ATTEMPT_STATES and sub is not None and sub.state == "merged":
            problems.append(
                f"attempt {a.id} (epoch {a.epoch} shard {a.shard}) is '{a.state}', but its "
                f"subtask was merged as v{sub.merged_version} from another attempt: a result "
                "nobody settled (not recorded as a duplicate)"
            )
    return problems

"""The assimilator: folds one finished attempt's result into the run's head.

This module owns the merge side of the hot path (docs/design.md §1-2): read the
result, validate it, pick α (schedule × staleness policy), compute the new
weights with the pure functions of :mod:`vcdl.merge`, write them as a new
immutable version group, and move the head by compare-and-swap in the ledger.
The read, the merge and the write are streamed a batch of tensors at a time
and overlap (:mod:`vcdl.driver.streamed`): the result is never whole in the
driver's memory.

A result is possibly broken (a dying machine writes garbage): every failure
reading, checking or merging it rejects it with a reason in the ledger, and
the epoch reissues its subtask; none fails the run (docs/design.md §7).
:func:`open_result` judges all that can be judged before data is read (the
group's record table, checked whole before anything is allocated; what the
worker reported), and :func:`~vcdl.driver.streamed.streamed_merge` turns
errors reading the data into reasons. Errors of the driver's own (the
ledger, the head, writing the version) propagate. Versions (the head, a
result's base) are read against the checksums the ledger recorded, not only
their groups' own.

Results that wait together may be folded (``merge.fold``,
:mod:`vcdl.driver.fold`): one pass, the versions between never written, the
same bytes as one at a time; whatever a fold cannot take sends the group
through :func:`merge_attempt` one by one.

Crash safety comes from the order: the version group is written completely
before the ledger points at it, and its path carries the attempt id, so a
merger that loses the CAS race (or dies) leaves an orphan group the ledger
never names — never a torn head. Exactly-once comes from the ledger's unique
(run, subtask) constraint on versions, not from this module's care.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

from vcdl.config import RunConfig
from vcdl.data import open_dataset
from vcdl.driver.head_cache import HeadCache, head_cache
from vcdl.driver.merge_plan import Candidate, Rejection, plan_merge
from vcdl.driver.streamed import Decoded, streamed_check, streamed_merge
from vcdl.driver.throughput import planned_rows
from vcdl.errors import (
    AlreadyMerged,
    DataError,
    HeadConflict,
    IntegrityError,
    StoreError,
    StoreNotFoundError,
)
from vcdl.ledger import Attempt, Ledger, Version
from vcdl.merge.checks import count_problem, metric_problem
from vcdl.merge.codec import PRECISIONS, Precision
from vcdl.merge.rules import rule_of
from vcdl.runtime import RunRef
from vcdl.states import MERGEABLE_ATTEMPT_STATES
from vcdl.store import WeightStore
from vcdl.store.paths import rule_state_path
from vcdl.store.streaming import TensorSource, specs_of
from vcdl.types import StateDict

MergeKind = Literal["merged", "duplicate", "rejected", "skipped"]


@dataclass
class MergeOutcome:
    """What happened to one result."""

    attempt_id: str
    kind: MergeKind
    version: int | None = None
    alpha: float | None = None
    staleness: int | None = None
    reason: str | None = None
    retries: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _reject(ref: RunRef, attempt: Attempt, reason: str, timings: dict[str, float]) -> MergeOutcome:
    ref.ledger().finish_attempt(
        attempt.id,
        state="rejected",
        result_uri=attempt.result_uri,
        samples=attempt.samples,
        loss=attempt.loss,
        train_seconds=attempt.train_seconds,
        reason=reason,
    )
    return MergeOutcome(attempt.id, "rejected", reason=reason, timings=timings)


def merge_attempt(
    ref: RunRef,
    attempt_id: str,
    cfg: RunConfig,
    cache: HeadCache | None = None,
    max_retries: int = 1000,
) -> MergeOutcome:
    """Merge one attempt's result into the head, at most once."""
    ledger, store = ref.ledger(), ref.store()
    rule = rule_of(cfg)
    cache = cache if cache is not None else head_cache(cfg)
    timings: dict[str, float] = {}
    attempt = ledger.get_attempt(attempt_id)
    if attempt.state == "duplicate":
        # Its own finish found the subtask merged by another attempt (the
        # ledger records that at once, vcdl/ledger/work.py): what a merge that
        # lost the race says, and its result is dead weight.
        if attempt.result_uri is not None:
            store.delete(attempt.result_uri)
        why = attempt.reason or "subtask already merged"
        return MergeOutcome(attempt_id, "duplicate", reason=why, timings=timings)
    if attempt.state not in MERGEABLE_ATTEMPT_STATES or attempt.result_uri is None:
        return MergeOutcome(attempt_id, "skipped", reason=f"attempt is {attempt.state}")

    opened = open_result(ref, attempt, cfg, cache, timings)
    if isinstance(opened, str):
        return _reject(ref, attempt, opened, timings)
    result, base, result_attrs = opened
    candidate = Candidate.of(attempt, result_attrs)

    for retry in range(max_retries):
        t = time.perf_counter()
        head_row = ledger.head(ref.run)
        # Checked against the ledger's checksum: a head rewritten in the store
        # (with fresh checksums of its own) is refused, not merged into.
        head = cache.get(head_row, functools.partial(store.read_state, expect=head_row.checksum))
        timings["read_head"] = timings.get("read_head", 0.0) + time.perf_counter() - t

        plan = plan_merge(
            rule,
            run=ref.run,
            lease=ref.lease,
            head=head_row.number,
            epochs=cfg.run.epochs,
            max_staleness=cfg.merge.max_staleness,
            merged_in_epoch=merged_in(ledger, ref.run, attempt.epoch),
            candidates=[candidate],
        )
        if isinstance(plan, Rejection):
            # A bad result is rejected as bad, not as stale.
            reason = streamed_check(rule, head, result)
            return _reject(ref, attempt, reason or plan.reason, timings)
        step = plan.last

        if base is None and rule.reads_base:
            # The same whatever the head does meanwhile: found once, not at every
            # CAS retry.
            t = time.perf_counter()
            try:
                base = base_of(ref, attempt, cache)
            except StoreError as exc:
                return _reject(ref, attempt, f"the result's base is unreadable: {exc}", timings)
            timings["read_base"] = time.perf_counter() - t

        state = (
            cache.rule_state(head_row, lambda v: read_rule_state(ref, store, v))
            if rule.keeps_state
            else None
        )
        path = plan.path
        # Read, merge (validation fused with the blend) and write, overlapped.
        t = time.perf_counter()
        spare = cache.take_spare(rule, head)
        try:
            streamed = streamed_merge(
                rule,
                head,
                result,
                step.blend,
                functools.partial(store.writer, path, specs_of(head), plan.attrs()),
                base=base if rule.reads_base else None,
                state=state,
                out=spare,
                mergers=cfg.merge.mergers,
            )
        except (IntegrityError, StoreNotFoundError) as exc:
            cache.give_back(spare)
            return _reject(ref, attempt, f"result unreadable: {exc}", timings)
        timings["merge"] = timings.get("merge", 0.0) + time.perf_counter() - t
        if streamed.applied is None:
            cache.give_back(spare)
            return _reject(ref, attempt, streamed.reason or "rejected", timings)
        merged = streamed.applied
        new = merged.weights
        checksum = streamed.checksum
        assert checksum is not None

        t = time.perf_counter()
        # The rule's state after this merge, beside the version (written before
        # the head moves, so the head always has its state; an orphan otherwise).
        state_path = rule_state_path(ref.run, path)
        if merged.state is not None:
            store.write_state(
                state_path, merged.state, attrs={"run": ref.run, "number": plan.number}
            )
        timings["write_version"] = timings.get("write_version", 0.0) + time.perf_counter() - t

        t = time.perf_counter()
        try:
            version = ledger.commit_merge(
                ref.run,
                attempt.id,
                expected_head=head_row.number,
                uri=path,
                checksum=checksum,
                alpha=step.alpha,
                staleness=step.staleness,
            )
        except HeadConflict:
            # Another merger moved the head first: our groups are orphans.
            delete_groups(store, path, state_path if merged.state is not None else None)
            continue
        except AlreadyMerged:
            delete_groups(store, path, state_path if merged.state is not None else None)
            store.delete(attempt.result_uri)
            return MergeOutcome(
                attempt.id, "duplicate", reason="subtask already merged", timings=timings
            )
        finally:
            timings["ledger"] = timings.get("ledger", 0.0) + time.perf_counter() - t
        cache.put(version.number, new, owned=True)
        if rule.keeps_state:
            cache.put_rule_state(version.number, merged.state)
            # Only the head's state is ever read again.
            store.delete(rule_state_path(ref.run, head_row.uri))
        # The result is folded into the version now; keep the store lean.
        store.delete(attempt.result_uri)
        return MergeOutcome(
            attempt.id,
            "merged",
            version=version.number,
            alpha=step.alpha,
            staleness=step.staleness,
            retries=retry,
            timings=timings,
        )
    raise HeadConflict(f"gave up merging attempt {attempt_id} after {max_retries} CAS conflicts")


def merged_in(ledger: Ledger, run: str, epoch: int) -> int:
    """How many subtasks of the run's ``epoch`` are merged (what α schedules by epoch read)."""
    return sum(1 for s in ledger.subtasks(run, epoch) if s.state == "merged")


def open_result(
    ref: RunRef,
    attempt: Attempt,
    cfg: RunConfig,
    cache: HeadCache,
    timings: dict[str, float] | None = None,
) -> tuple[TensorSource, StateDict | TensorSource | None, dict[str, Any]] | str:
    """The attempt's result ready to stream (decoded when reduced), its base if that was
    needed, and its attrs; or why it must be rejected.

    Everything about the result that can be judged before its data is read:
    the group exists, is complete and its record table is sound (bounds,
    overlaps, sizes; checked whole before anything is allocated), the worker's
    report is believable (:func:`report_problem`), the encoding is known and
    fits the base. A failure to read the result (or its base) is a reason,
    never an exception: one result must not fail the run.
    """
    t = time.perf_counter()
    try:
        # Streamed: the result is read a batch of tensors at a time while the
        # new version is merged and written (vcdl.driver.streamed).
        stored = ref.store().reader(attempt.result_uri or "")
    except StoreError as exc:
        return f"result unreadable: {exc}"
    if timings is not None:
        timings["read_result"] = time.perf_counter() - t
    problem = report_problem(attempt, stored.attrs, shard_samples(ref, cfg, attempt))
    if problem is not None:
        return problem
    encoding = stored.attrs.get("encoding", "full")
    if not isinstance(encoding, str) or encoding not in PRECISIONS:
        return f"result has an unknown encoding {encoding!r}"
    if encoding == "full":
        return stored, None, stored.attrs
    # A change from the base version: decoded batch by batch against it.
    try:
        base = base_of(ref, attempt, cache)
    except StoreError as exc:
        return f"the result's base is unreadable: {exc}"
    decoded = Decoded(stored, base, cast(Precision, encoding))
    if decoded.problem is not None:
        return decoded.problem
    return decoded, base, stored.attrs


def base_of(ref: RunRef, attempt: Attempt, cache: HeadCache) -> StateDict | TensorSource:
    """The weights of the attempt's base version: kept in memory when recent (the cache
    never writes into a buffer an input uses), else streamed from the store, checked
    against the ledger's checksum."""
    row = ref.ledger().get_version(ref.run, attempt.base_version)
    kept = cache.cached(row.number)
    return kept if kept is not None else ref.store().reader(row.uri, expect=row.checksum)


def read_rule_state(ref: RunRef, store: WeightStore, version: Version) -> StateDict | None:
    """The rule's state stored beside ``version``; None before the first merge."""
    path = rule_state_path(ref.run, version.uri)
    return store.read_state(path) if store.exists(path) else None


def delete_groups(store: WeightStore, *paths: str | None) -> None:
    for path in paths:
        if path is not None:
            store.delete(path)


def report_problem(attempt: Attempt, attrs: Mapping[str, Any], limit: int | None) -> str | None:
    """Why what the worker reported with its result is not believable, or None.

    The sample count must be a positive integer within the shard's samples
    (``limit``), as must the planned samples of a partial result; the loss
    and the training seconds must be finite (the loss may be missing, or NaN
    for an attempt that resumed a checkpoint and trained no batch of its own).
    """
    problem = count_problem(attempt.samples, limit)
    if problem is None and attempt.state == "interrupted" and "planned_samples" in attrs:
        problem = count_problem(attrs["planned_samples"], limit, "planned sample count")
    if problem is None:
        problem = metric_problem(attempt.loss, "loss", allow_nan=attempt.resumed_from is not None)
    if problem is None:
        problem = metric_problem(attempt.train_seconds, "training seconds", minimum=0.0)
    return None if problem is None else f"bad report from the worker: {problem}"


# Per run (its data set is fixed for its life): one data set lookup per run, not per merge.
_SHARD_ROWS: dict[tuple[str, str, str, str, int], int] = {}


def shard_samples(ref: RunRef, cfg: RunConfig, attempt: Attempt | None = None) -> int | None:
    """The most samples an attempt of this run can train: its largest shard's rows times
    the local epochs (None if the data set cannot be described). Under a throughput plan
    (``cluster.sizing``), ``attempt``'s own shard's planned rows times the local epochs."""
    if attempt is not None and cfg.cluster.sizing == "throughput":
        planned = planned_rows(ref, cfg, attempt.epoch, attempt.shard)
        if planned is not None:
            return planned * cfg.train.local_epochs
    key = (ref.ledger_url, ref.store_url, ref.run, cfg.data.name, cfg.data.shards)
    rows = _SHARD_ROWS.get(key)
    if rows is None:
        try:
            n = open_dataset(ref.store(), cfg.data.name).n_train
        except (DataError, StoreError):
            return None
        rows = _SHARD_ROWS[key] = -(-n // cfg.data.shards)
    return rows * cfg.train.local_epochs

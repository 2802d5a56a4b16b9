"""The assimilator: folds one finished attempt's result into the run's head.

This module owns the merge side of the hot path (DESIGN.md §1-2): read the
result, validate it, pick α (schedule × staleness policy), compute the new
weights with the pure functions of :mod:`vcdl.merge`, write them as a new
immutable version group, and move the head by compare-and-swap in the ledger.

Crash safety comes from the order: the version group is written completely
before the ledger points at it, and its path carries the attempt id, so a
merger that loses the CAS race (or dies) leaves an orphan group the ledger
never names — never a torn head. Exactly-once comes from the ledger's unique
(run, subtask) constraint on versions, not from this module's care.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from vcdl.config import RunConfig
from vcdl.errors import AlreadyMerged, HeadConflict, IntegrityError, StoreNotFoundError
from vcdl.ledger import Attempt, Version
from vcdl.merge import output_problem, staleness_alpha, validate_result, validated_vc_asgd
from vcdl.merge_delta import validated_delta
from vcdl.runtime import RunRef, version_path
from vcdl.schedules import alpha_schedule
from vcdl.types import StateDict

MergeKind = Literal["merged", "duplicate", "rejected", "skipped"]
MERGEABLE_ATTEMPT_STATES = frozenset({"finished", "interrupted"})
# Versions kept in memory for the delta rule's bases: with W workers a
# result is usually at most W - 1 versions stale; older bases are read back.
DELTA_KEEP = 4


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


class HeadCache:
    """The newest head's weights, kept by the process that merges, plus one spare state.

    The driver merges every result of a run, so re-reading the version it has
    just written would double the store traffic of the hot path.

    Double buffering: a merge written into fresh memory allocates (and
    page-faults) a whole state; a flat 98 MiB blend into fresh memory was 3x
    slower than into a preallocated buffer here. So when a new head
    displaces a state the cache owns, that state becomes the *spare*, and
    :meth:`merge` writes the next version into its tensors. The cache owns
    the states it loaded and the ones :meth:`merge` produced; a state handed
    to :meth:`put` by a caller is owned only with ``owned=True``, and is
    otherwise never written to. A state returned by :meth:`get` stays
    unchanged until ``keep + 2`` more versions have been put (it is then
    recycled); copy it to keep it longer. Costs one extra state of memory
    (the spare) between merges; the peak during a merge (head, result,
    output) is unchanged.

    ``keep``: how many displaced heads to hold as well, for the ``delta``
    rule, whose results name their base: with a few workers nearly every
    base is one of the last versions, so they are in memory rather than
    read back from the store (``keep`` more states of memory).
    """

    def __init__(self, keep: int = 0) -> None:
        self.number: int | None = None
        self.state: StateDict | None = None
        self._owned = False
        self._spare: StateDict | None = None
        self.keep = keep
        self._recent: OrderedDict[int, tuple[StateDict, bool]] = OrderedDict()

    def get(self, version: Version, load: Callable[[str], StateDict]) -> StateDict:
        if self.number == version.number and self.state is not None:
            return self.state
        state = load(version.uri)
        self.put(version.number, state, owned=True)
        return state

    def base(self, version: Version, load: Callable[[str], StateDict]) -> StateDict:
        """The weights of ``version`` (a result's base): the head, a kept one, or loaded."""
        if self.number == version.number and self.state is not None:
            return self.state
        kept = self._recent.get(version.number)
        return kept[0] if kept is not None else load(version.uri)

    def put(self, number: int, state: StateDict, owned: bool = False) -> None:
        """Make ``state`` the cached head; ``owned`` lets the cache recycle it later."""
        old, old_owned, old_number = self.state, self._owned, self.number
        self.number, self.state, self._owned = number, state, owned
        if old is None or old is state or old_number is None:
            return
        if self.keep > 0:
            self._recent[old_number] = (old, old_owned)
            self._recent.pop(number, None)
            if len(self._recent) <= self.keep:
                return
            _, (old, old_owned) = self._recent.popitem(last=False)
        if old_owned:
            self._spare = old

    def merge(
        self,
        head: StateDict,
        result: StateDict,
        alpha: float,
        max_update_norm: float | None = None,
        base: StateDict | None = None,
    ) -> StateDict | str:
        """Validate ``result`` and merge it (:func:`~vcdl.merge.validated_vc_asgd`).

        With ``base``, the ``delta`` rule instead
        (:func:`~vcdl.merge_delta.validated_delta`): the result's change from
        ``base`` is added to ``head``. Returns the new state, written into
        the spare state's tensors when they fit (put it with ``owned=True``
        so it is recycled in turn), or the reason to reject the result.
        """
        spare, self._spare = self._spare, None
        inputs = (result,) if base is None else (result, base)
        if spare is not None and output_problem(spare, head, *inputs) is not None:
            spare = None  # another architecture, or it overlaps an input: allocate
        if base is None:
            merged = validated_vc_asgd(head, result, alpha, max_update_norm, out=spare)
        else:
            merged = validated_delta(head, result, base, alpha, max_update_norm, out=spare)
        if isinstance(merged, str):
            self._spare = spare  # rejected: the buffers are still ours to reuse
        return merged


def _kept_bases(cfg: RunConfig) -> int:
    return DELTA_KEEP if cfg.merge.rule == "delta" else 0


def head_cache(cfg: RunConfig) -> HeadCache:
    """The cache a run's merger needs: with recent bases kept for the ``delta`` rule."""
    return HeadCache(keep=_kept_bases(cfg))


# The driver's caches, one per run it drives, kept across the run's epochs.
_RUN_CACHES: dict[tuple[str, str, str], HeadCache] = {}


def run_head_cache(ref: RunRef, cfg: RunConfig) -> HeadCache:
    """This process's cache for the run, kept from one epoch to the next.

    Each epoch would otherwise start by reading the head back from the store
    (and, for the ``delta`` rule, the bases) and allocate a fresh spare. A
    cached version is safe to reuse: a run's versions are never rewritten,
    and the key names the ledger and the store as well as the run.
    """
    key = _run_key(ref)
    cache = _RUN_CACHES.get(key)
    if cache is None or cache.keep != _kept_bases(cfg):
        cache = _RUN_CACHES[key] = head_cache(cfg)
    return cache


def forget_run_cache(ref: RunRef) -> None:
    """Drop the run's cache (its weights' memory); the driver calls it when the run ends."""
    _RUN_CACHES.pop(_run_key(ref), None)


def _run_key(ref: RunRef) -> tuple[str, str, str]:
    return (ref.ledger_url, ref.store_url, ref.run)


def merge_alpha(cfg: RunConfig, epoch: int, staleness: int, merged_in_epoch: int) -> float | None:
    """α for one merge; None means the staleness policy rejects the result.

    For the ``average`` rule the k-th result of an epoch (0-based) gets
    α = k/(k+1): a running mean, so after all S shards the head is their
    plain average (every shard started from the same version).
    """
    m = cfg.merge
    if m.rule == "average":
        return merged_in_epoch / (merged_in_epoch + 1)
    alpha = alpha_schedule(
        m.schedule, epoch, cfg.run.epochs, m.alpha, alpha_end=m.alpha_end, alphas=m.alphas
    )
    return staleness_alpha(
        alpha,
        staleness,
        m.staleness,
        power=m.staleness_power,
        max_staleness=m.max_staleness,
        grace=m.staleness_grace,
    )


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
    cache = cache if cache is not None else head_cache(cfg)
    timings: dict[str, float] = {}
    attempt = ledger.get_attempt(attempt_id)
    if attempt.state not in MERGEABLE_ATTEMPT_STATES or attempt.result_uri is None:
        return MergeOutcome(attempt_id, "skipped", reason=f"attempt is {attempt.state}")

    t = time.perf_counter()
    try:
        result = store.read_state(attempt.result_uri)
    except (IntegrityError, StoreNotFoundError) as exc:
        return _reject(ref, attempt, f"result unreadable: {exc}", timings)
    timings["read_result"] = time.perf_counter() - t

    base: StateDict | None = None
    for retry in range(max_retries):
        t = time.perf_counter()
        head_row = ledger.head(ref.run)
        head = cache.get(head_row, store.read_state)
        timings["read_head"] = timings.get("read_head", 0.0) + time.perf_counter() - t

        staleness = head_row.number - attempt.base_version
        merged_in_epoch = sum(
            1 for s in ledger.subtasks(ref.run, attempt.epoch) if s.state == "merged"
        )
        alpha = merge_alpha(cfg, attempt.epoch, staleness, merged_in_epoch)
        if alpha is None:
            # A bad result is rejected as bad, not as stale.
            reason = validate_result(head, result, cfg.merge.max_update_norm)
            return _reject(
                ref,
                attempt,
                reason or f"stale: staleness {staleness} > {cfg.merge.max_staleness}",
                timings,
            )
        blend_alpha = alpha
        if attempt.state == "interrupted" and attempt.samples is not None:
            # A partial result counts in proportion to the samples it saw: the
            # result scaled towards the head by f (scale_result), then merged
            # with alpha, is the head merged with the raw result at
            # 1 - (1 - alpha) * f; one pass and no scaled copy of the result.
            planned = max(1, _planned_samples(ref, attempt))
            fraction = min(1.0, attempt.samples / planned)
            blend_alpha = 1.0 - (1.0 - alpha) * fraction

        if base is None and cfg.merge.rule == "delta":
            # The same whatever the head does meanwhile: read once, not at every
            # CAS retry. A retry that evicts it from the cache cannot overwrite
            # it: the cache never writes into a buffer an input uses.
            t = time.perf_counter()
            base_row = ledger.get_version(ref.run, attempt.base_version)
            base = cache.base(base_row, store.read_state)
            timings["read_base"] = time.perf_counter() - t

        # The merge phase: validation (NaN/Inf, norm bound) fused with the blend.
        t = time.perf_counter()
        merged = cache.merge(head, result, blend_alpha, cfg.merge.max_update_norm, base=base)
        timings["merge"] = timings.get("merge", 0.0) + time.perf_counter() - t
        if isinstance(merged, str):
            return _reject(ref, attempt, merged, timings)
        new = merged

        t = time.perf_counter()
        number = head_row.number + 1
        path = version_path(ref.run, number, attempt.id[:12])
        store.write_state(
            path,
            new,
            attrs={
                "run": ref.run,
                "number": number,
                "parent": head_row.number,
                "attempt": attempt.id,
                "epoch": attempt.epoch,
                "shard": attempt.shard,
                "alpha": alpha,
                "staleness": staleness,
            },
        )
        checksum = store.checksum(path)
        timings["write_version"] = timings.get("write_version", 0.0) + time.perf_counter() - t

        t = time.perf_counter()
        try:
            version = ledger.commit_merge(
                ref.run,
                attempt.id,
                expected_head=head_row.number,
                uri=path,
                checksum=checksum,
                alpha=alpha,
                staleness=staleness,
            )
        except HeadConflict:
            # Another merger moved the head first: our group is an orphan.
            store.delete(path)
            continue
        except AlreadyMerged:
            store.delete(path)
            store.delete(attempt.result_uri)
            return MergeOutcome(
                attempt.id, "duplicate", reason="subtask already merged", timings=timings
            )
        finally:
            timings["ledger"] = timings.get("ledger", 0.0) + time.perf_counter() - t
        cache.put(version.number, new, owned=True)
        # The result is folded into the version now; keep the store lean.
        store.delete(attempt.result_uri)
        return MergeOutcome(
            attempt.id,
            "merged",
            version=version.number,
            alpha=alpha,
            staleness=staleness,
            retries=retry,
            timings=timings,
        )
    raise HeadConflict(f"gave up merging attempt {attempt_id} after {max_retries} CAS conflicts")


def _planned_samples(ref: RunRef, attempt: Attempt) -> int:
    attrs = ref.store().read_attrs(attempt.result_uri or "")
    return int(attrs.get("planned_samples") or attempt.samples or 1)

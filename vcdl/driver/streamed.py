"""One result merged into the head a batch of tensors at a time, in bounded memory.

This module owns the streamed merge the assimilator runs
(:mod:`vcdl.driver.assimilator`): the result (and, for the rules that read
it, the result's base) is read from the store a batch of tensors at a time,
each batch is merged by the run's rule (:meth:`MergeRule.apply` on the
batch: every rule is elementwise, so a batch merges exactly as it would
within the whole state, bit for bit), and the new version is written as the
batches come out. Three stages overlap, each in its own thread: reading and
verifying batch k + 1, merging batch k, writing and hashing batch k − 1
(the threads are :mod:`vcdl.driver.stages`'); the bytes in flight are a few
batches. A tensor larger than a batch goes in
batches of its rows (:func:`~vcdl.store.streaming.batches`), so a model
whose one tensor is most of it (a token embedding) is no exception.

The driver's memory is then the head it keeps (:class:`HeadCache`), the
buffers the new version is merged into (which become the next head), and a
few batches: about 2× the model, where reading the whole result first made
it 3× and more. Whole-state checks become per-batch checks plus what
accumulates: the structure is compared from the group's records before any
data is read; NaN/Inf per batch; the update-norm bound (``merge.max_update_norm``)
over every batch, so a result above it is rejected after its version was
written, and the written group is deleted (an orphan if that fails).

Several results that wait together (``merge.fold``) go through one pass
(:func:`streamed_fold`): each batch through every merge in turn, only the
last version written; one result is the pass with one step.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from vcdl.driver.stages import Stage, prefetch
from vcdl.errors import MergeError, StoreError
from vcdl.merge.checks import mismatch, update_norm
from vcdl.merge.codec import Precision, check_stored, decode, stored_names
from vcdl.merge.rules import STEP_KEY, Applied, MergeRule, merge_rule
from vcdl.store.streaming import (
    Part,
    StateReader,
    StateWriter,
    TensorSource,
    batches,
    meta_state,
    read_parts,
    specs_of,
    take,
)
from vcdl.types import StateDict

BATCH_BYTES = 64 << 20
"""Bytes of result per batch: big enough that per-batch costs vanish (a
batch is ~16 chunks), small beside any model worth streaming."""


@dataclass
class Streamed:
    """A streamed merge's outcome: the new weights and rule state, or why not."""

    applied: Applied | None
    reason: str | None
    checksum: str | None = None
    timings: dict[str, float] | None = None
    """Seconds each stage was busy (read, merge, write); they overlap."""
    failed: int | None = None
    """Which result was refused (its index in a fold; 0 for one result)."""


class Decoded:
    """A reduced-precision result (``merge.result_precision``) read as the full result.

    Each batch is read with the same batch of the result's base version
    (in memory or streamed) and decoded (:func:`vcdl.merge.codec.decode`).
    """

    def __init__(
        self, stored: StateReader, base: StateDict | TensorSource, precision: Precision
    ) -> None:
        self._stored, self.base, self.precision = stored, base, precision
        base_specs = specs_of(base) if isinstance(base, dict) else base.specs
        self.specs = base_specs
        self._floating = {s.name: s.dtype.is_floating_point for s in base_specs}
        self.problem = check_stored(
            {s.name: (s.dtype, s.shape) for s in stored.specs},
            {s.name: (s.dtype, s.shape) for s in base_specs},
            precision,
        )

    def read(self, names: Iterable[str]) -> StateDict:
        specs = {s.name: s for s in self.specs}
        return self.read_both([Part(specs[k]) for k in names])[0]

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        spec = next(s for s in self.specs if s.name == name)
        return self.read_both([Part(spec, start, stop)])[0][name]

    def read_both(self, parts: Sequence[Part]) -> tuple[StateDict, StateDict]:
        """A batch of the result and the same batch of its base (read once for both)."""
        names = stored_names([p.name for p in parts], self._floating, self.precision)
        if len(parts) == 1 and not parts[0].whole:
            # Rows of one tensor: its int8 scales are one per row, the same rows.
            p = parts[0]
            assert p.stop is not None
            stored = {k: self._stored.read_rows(k, p.start, p.stop) for k in names}
        else:
            stored = self._stored.read(names)
        base = self.base
        base_sub = take(base, parts) if isinstance(base, dict) else read_parts(base, parts)
        return decode(stored, base_sub, self.precision), base_sub


@dataclass(frozen=True)
class Step:
    """One result of a fold (:func:`streamed_fold`): its source, its α, its base if read."""

    result: TensorSource
    alpha: float
    base: StateDict | TensorSource | None = None


def streamed_merge(
    rule: MergeRule,
    head: StateDict,
    result: TensorSource,
    alpha: float,
    writer: Callable[[], StateWriter],
    *,
    base: StateDict | TensorSource | None = None,
    state: StateDict | None = None,
    out: StateDict | None = None,
    batch_bytes: int = BATCH_BYTES,
    mergers: int = 1,
) -> Streamed:
    """Merge the result behind ``result`` into ``head`` by ``rule`` and write the new version.

    ``writer`` opens the version's :class:`StateWriter` (called once the
    structure checks passed: nothing is written for a result of another
    model). ``base``: the result's base, in memory or in the store, for the
    rules that read it. ``out``: buffers with the head's layout to merge into
    (see :meth:`HeadCache.merge`). Returns the merged weights and the rule's
    state with the version's checksum, or the reason to reject the result
    (its version then deleted). Never raises for a bad result (errors
    reading it or its base, and inputs the rule refuses, become the reason);
    errors writing the version propagate. ``mergers``: as for
    :func:`streamed_fold`.
    """
    return streamed_fold(
        rule,
        head,
        [Step(result, alpha, base)],
        writer,
        state=state,
        out=out,
        batch_bytes=batch_bytes,
        mergers=mergers,
    )


def streamed_fold(
    rule: MergeRule,
    head: StateDict,
    steps: Sequence[Step],
    writer: Callable[[], StateWriter],
    *,
    state: StateDict | None = None,
    out: StateDict | None = None,
    batch_bytes: int = BATCH_BYTES,
    mergers: int = 1,
) -> Streamed:
    """Merge several results into ``head`` one after the other, writing only the last version.

    Step i merges into what step i - 1 made, with its own α, exactly as
    :func:`streamed_merge` would one result at a time, bit for bit: every
    rule is elementwise, so the chain runs a batch of tensors at a time
    (each batch through every step) and the versions between are never
    whole in memory, hashed or written. The results are read one batch of
    one result at a time, in the order the chain takes them, so the
    read-ahead is a single merge's; the versions between add one batch
    while it goes through the chain. The rule's state goes through the
    chain the same way.

    A result refused (unreadable, NaN/Inf, the norm bound, the rule's own
    checks) stops the fold: the outcome names the step (``Streamed.failed``)
    and nothing is left written. The caller then merges the results one at
    a time, which refuses that one as it would have alone.

    ``mergers`` above 1: that many processes each merge and write their
    range of the version's chunks (:mod:`vcdl.driver.sharded`); the same
    bytes.
    """
    if not steps:
        raise ValueError("streamed_fold needs at least one result")
    head_meta = meta_state(specs_of(head))
    reason: str | None
    for i, step in enumerate(steps):
        reason = mismatch(head_meta, meta_state(step.result.specs), "result")
        if reason is None and step.base is not None and not isinstance(step.base, dict):
            reason = mismatch(head_meta, meta_state(step.base.specs), "base")
            if reason is not None:
                reason = f"the result's base does not fit the head: {reason}"
        if reason is not None:
            return Streamed(None, reason, failed=i)
    if mergers > 1:
        from vcdl.driver.sharded import sharded_fold

        return sharded_fold(
            rule, head, steps, writer, state=state, out=out, batch_bytes=batch_bytes, k=mergers
        )
    plan = batches(specs_of(head), batch_bytes)
    busy = {"read": 0.0, "merge": 0.0, "write": 0.0}

    def write(batch: tuple[list[Part], StateDict]) -> None:
        parts, tensors = batch
        t = time.perf_counter()
        if parts[0].whole:
            version.write(tensors)
        else:
            version.write_rows(parts[0].name, tensors[parts[0].name])
        busy["write"] += time.perf_counter() - t

    version = writer()
    weights: StateDict = {}
    new_state: StateDict | None = {} if rule.keeps_state else None
    try:
        with Stage(write, depth=2) as writing:

            def emit(parts: list[Part], current: StateDict, state_sub: StateDict | None) -> None:
                _gather(weights, parts, current, out)
                if new_state is not None and state_sub is not None:
                    _gather(new_state, parts, state_sub, None)
                writing.put((parts, current))

            chained = chain(rule, head, steps, plan, emit, state=state, out=out, busy=busy)
        reason, failed = chained.reason, chained.failed
        if reason is None:
            reason, failed = norm_problem(rule, chained.norm_sq)
        if reason is not None:
            version.abort()
            return Streamed(None, reason, failed=failed)
        t = time.perf_counter()
        checksum = version.commit()
        busy["write"] += time.perf_counter() - t
    except Unreadable as exc:
        version.abort()
        return Streamed(None, str(exc), failed=exc.step)
    except BaseException:
        version.abort()
        raise
    return Streamed(Applied(weights, new_state), None, checksum, busy)


@dataclass
class Chained:
    """What running batches through a chain of merges found (:func:`chain`)."""

    reason: str | None
    failed: int | None
    norm_sq: list[float]
    """Per step, the squared update norm over the batches (when the rule bounds it)."""


def chain(
    rule: MergeRule,
    head: StateDict,
    steps: Sequence[Step],
    plan: Sequence[list[Part]],
    emit: Callable[[list[Part], StateDict, StateDict | None], None],
    *,
    state: StateDict | None = None,
    out: StateDict | None = None,
    busy: dict[str, float] | None = None,
    norm_of: Callable[[list[Part], StateDict, StateDict], float] | None = None,
) -> Chained:
    """Each batch of ``plan`` through every step in turn; ``emit`` gets what each batch became.

    The reading runs one batch ahead in a thread. Stops at the first result
    refused (NaN/Inf, the rule's own checks); read errors raise
    :class:`Unreadable`. The norm bound over all batches is the caller's
    (:func:`norm_problem`): ``norm_of`` (default: the batch's whole update
    norm) says how much of a batch counts.
    """
    busy = busy if busy is not None else {"read": 0.0, "merge": 0.0, "write": 0.0}
    bound = rule.settings.max_update_norm
    # Per batch without the global bound: it is summed here over every batch.
    unbounded = merge_rule(
        rule.settings.model_copy(update={"max_update_norm": None}), workers=rule.workers
    )
    last = len(steps) - 1
    norm_sq = [0.0] * len(steps)

    def read(job: tuple[list[Part], int]) -> tuple[StateDict, StateDict | None]:
        parts, i = job
        t = time.perf_counter()
        got: tuple[StateDict, StateDict | None]
        result, base = steps[i].result, steps[i].base
        with _unreadable(i):
            if isinstance(result, Decoded) and base is result.base:
                got = result.read_both(parts)  # the base read once, not twice
            elif base is None:
                got = read_parts(result, parts), None
            else:
                base_sub = take(base, parts) if isinstance(base, dict) else read_parts(base, parts)
                got = read_parts(result, parts), base_sub
        busy["read"] += time.perf_counter() - t
        return got

    # One result's batch at a time, in the order the chain takes them: the
    # bytes read ahead are those of a single merge, however many results.
    jobs = ((parts, i) for parts in plan for i in range(len(steps)))
    with contextlib.closing(prefetch(read, jobs)) as inputs:
        for parts in plan:
            current: StateDict = take(head, parts)
            state_sub = _state_part(state, parts)
            for i, step in enumerate(steps):
                sub, base_sub = next(inputs)
                t = time.perf_counter()  # merge time, not the wait for the read
                if bound is not None:
                    ref = base_sub if rule.reads_base and base_sub is not None else current
                    reason = _bounded(ref, sub)
                    if reason is not None:
                        return Chained(reason, i, norm_sq)
                    norm = norm_of(parts, ref, sub) if norm_of else update_norm(ref, sub)
                    norm_sq[i] += norm**2
                try:
                    applied = unbounded.apply(
                        current,
                        sub,
                        step.alpha,
                        base=base_sub,
                        state=state_sub,
                        # The versions between are never whole: only the
                        # last step writes into the new version's buffers.
                        out=None if out is None or i < last else take(out, parts),
                    )
                except MergeError as exc:  # inputs the rule refuses: this result's
                    applied = f"cannot merge the result: {exc}"
                if isinstance(applied, str):
                    return Chained(applied, i, norm_sq)
                current, state_sub = applied.weights, applied.state
                busy["merge"] += time.perf_counter() - t
            emit(parts, current, state_sub)
    return Chained(None, None, norm_sq)


def norm_problem(rule: MergeRule, norm_sq: Sequence[float]) -> tuple[str | None, int | None]:
    """The first step whose update norm over all batches exceeds the rule's bound, and why."""
    bound = rule.settings.max_update_norm
    if bound is None:
        return None, None
    for i, total_sq in enumerate(norm_sq):
        total = math.sqrt(total_sq)
        if not total <= bound:
            return f"update norm {total:.6g} exceeds max_update_norm {bound:.6g}", i
    return None, None


def streamed_check(
    rule: MergeRule, head: StateDict, result: TensorSource, batch_bytes: int = BATCH_BYTES
) -> str | None:
    """Why the result must not be merged (structure, NaN/Inf, norm bound), reading it in batches.

    For a result that is rejected anyway (too stale): a bad result is
    recorded as bad, not as stale, without holding it whole in memory.
    """
    from vcdl.merge.checks import validate_result

    reason = mismatch(meta_state(specs_of(head)), meta_state(result.specs), "result")
    if reason is not None:
        return reason
    bound = rule.settings.max_update_norm
    norm_sq = 0.0
    for parts in batches(specs_of(head), batch_bytes):
        try:
            with _unreadable():
                sub = read_parts(result, parts)
        except Unreadable as exc:
            return str(exc)
        head_sub = take(head, parts)
        reason = validate_result(head_sub, sub, None)
        if reason is not None:
            return reason
        if bound is not None:
            norm_sq += update_norm(head_sub, sub) ** 2
    if bound is not None and not math.sqrt(norm_sq) <= bound:
        return f"update norm {math.sqrt(norm_sq):.6g} exceeds max_update_norm {bound:.6g}"
    return None


class Unreadable(Exception):
    """A batch of the result (or of its base) could not be read; the message is the reason.

    ``step``: which result of a fold (:func:`streamed_fold`) it was.
    """

    def __init__(self, message: str, step: int = 0) -> None:
        super().__init__(message)
        self.step = step


@contextlib.contextmanager
def _unreadable(step: int = 0) -> Iterator[None]:
    """Errors reading a result's batch, as the reason to reject it.

    What a result's bytes or records can raise: the store's errors (missing,
    torn, corrupt, malformed) and the value errors of decoding them. Errors
    of the driver's own writes are not caught here.
    """
    try:
        yield
    except (StoreError, ValueError) as exc:
        raise Unreadable(f"result unreadable: {exc}", step) from exc


def _bounded(ref: StateDict, sub: StateDict) -> str | None:
    """NaN/Inf in the batch of a result, before its norm is summed."""
    from vcdl.merge.checks import validate_result

    return validate_result(ref, sub, None)


def _state_part(state: StateDict | None, parts: list[Part]) -> StateDict | None:
    """The rule state's tensors of one batch (with the step count), or None."""
    if state is None:
        return None
    sub = {p.name: p.of(state[p.name]) for p in parts if p.name in state}
    if STEP_KEY in state:
        sub[STEP_KEY] = state[STEP_KEY]
    return sub


def _gather(into: StateDict, parts: list[Part], batch: StateDict, out: StateDict | None) -> None:
    """A merged batch into the whole state: whole tensors as they are, rows into
    their tensor (``out``'s when the rows were merged into it, else a new one
    allocated at its first rows). Entries that are not parts (the step count)
    are taken as they are."""
    split = {p.name: p for p in parts if not p.whole}
    for name, tensor in batch.items():
        p = split.get(name)
        if p is None:
            into[name] = tensor
            continue
        whole = into.get(name)
        if whole is None:
            whole = into[name] = out[name] if out is not None else tensor.new_empty(p.spec.shape)
        rows = p.of(whole)
        if rows.data_ptr() != tensor.data_ptr():  # not merged in place (no out buffers)
            rows.copy_(tensor)

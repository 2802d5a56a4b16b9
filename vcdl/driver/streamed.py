"""One result merged into the head a batch of tensors at a time, in bounded memory.

This module owns the streamed merge the assimilator runs
(:mod:`vcdl.driver.assimilator`): the result (and, for the rules that read
it, the result's base) is read from the store a batch of tensors at a time,
each batch is merged by the run's rule (:meth:`MergeRule.apply` on the
batch: every rule is elementwise, so a batch merges exactly as it would
within the whole state, bit for bit), and the new version is written as the
batches come out. Three stages overlap, each in its own thread: reading and
verifying batch k + 1, merging batch k, writing and hashing batch k − 1; the
bytes in flight are a few batches.

The driver's memory is then the head it keeps (:class:`HeadCache`), the
buffers the new version is merged into (which become the next head), and a
few batches: about 2× the model, where reading the whole result first made
it 3× and more. Whole-state checks become per-batch checks plus what
accumulates: the structure is compared from the group's records before any
data is read; NaN/Inf per batch; the update-norm bound (``merge.max_update_norm``)
over every batch, so a result above it is rejected after its version was
written, and the written group is deleted (an orphan if that fails).
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from vcdl.errors import MergeError, StoreError
from vcdl.merge.checks import mismatch, update_norm
from vcdl.merge.codec import Precision, check_stored, decode, stored_names
from vcdl.merge.rules import STEP_KEY, Applied, MergeRule, merge_rule
from vcdl.store.streaming import (
    StateReader,
    StateWriter,
    TensorSource,
    batches,
    meta_state,
    specs_of,
)
from vcdl.types import StateDict

BATCH_BYTES = 64 << 20
"""Bytes of result per batch: big enough that per-batch costs vanish (a
batch is ~16 chunks), small beside any model worth streaming."""

_T = TypeVar("_T")


@dataclass
class Streamed:
    """A streamed merge's outcome: the new weights and rule state, or why not."""

    applied: Applied | None
    reason: str | None
    checksum: str | None = None
    timings: dict[str, float] | None = None
    """Seconds each stage was busy (read, merge, write); they overlap."""


class Decoded:
    """A reduced-precision result (``merge.result_precision``) read as the full result.

    Each batch is read with the same batch of the result's base version
    (in memory or streamed) and decoded (:func:`vcdl.merge.codec.decode`).
    """

    def __init__(
        self, stored: StateReader, base: StateDict | TensorSource, precision: Precision
    ) -> None:
        self._stored, self._base, self.precision = stored, base, precision
        base_specs = specs_of(base) if isinstance(base, dict) else base.specs
        self.specs = base_specs
        self._floating = {s.name: s.dtype.is_floating_point for s in base_specs}
        self.problem = check_stored(
            {s.name: (s.dtype, s.shape) for s in stored.specs},
            {s.name: (s.dtype, s.shape) for s in base_specs},
            precision,
        )

    def read(self, names: Iterable[str]) -> StateDict:
        keys = list(names)
        stored = self._stored.read(stored_names(keys, self._floating, self.precision))
        base = self._base
        base_sub = {k: base[k] for k in keys} if isinstance(base, dict) else base.read(keys)
        return decode(stored, base_sub, self.precision)


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
    errors writing the version propagate.
    """
    reason = mismatch(meta_state(specs_of(head)), meta_state(result.specs), "result")
    if reason is not None:
        return Streamed(None, reason)
    if base is not None and not isinstance(base, dict):
        reason = mismatch(meta_state(specs_of(head)), meta_state(base.specs), "base")
        if reason is not None:
            return Streamed(None, f"the result's base does not fit the head: {reason}")
    bound = rule.settings.max_update_norm
    # Per batch without the global bound: it is summed here over every batch.
    unbounded = merge_rule(rule.settings.model_copy(update={"max_update_norm": None}))
    plan = batches(specs_of(head), batch_bytes)

    busy = {"read": 0.0, "merge": 0.0, "write": 0.0}

    def read(names: list[str]) -> tuple[StateDict, StateDict | None]:
        t = time.perf_counter()
        got: tuple[StateDict, StateDict | None]
        with _unreadable():
            sub = result.read(names)
            if base is not None and not isinstance(base, dict):
                got = sub, base.read(names)
            else:
                got = sub, None if base is None else {k: base[k] for k in names}
        busy["read"] += time.perf_counter() - t
        return got

    def write(tensors: StateDict) -> None:
        t = time.perf_counter()
        version.write(tensors)
        busy["write"] += time.perf_counter() - t

    version = writer()
    norm_sq = 0.0
    weights: StateDict = {}
    new_state: StateDict | None = {} if rule.keeps_state else None
    try:
        with _Stage(write, depth=2) as writing:
            for (sub, base_sub), specs in zip(
                _prefetch(read, ([s.name for s in b] for b in plan)), plan, strict=True
            ):
                t = time.perf_counter()
                names = [s.name for s in specs]
                head_sub = {k: head[k] for k in names}
                if bound is not None:
                    ref = base_sub if rule.reads_base and base_sub is not None else head_sub
                    reason = _bounded(ref, sub)
                    if reason is not None:
                        break
                    norm_sq += update_norm(ref, sub) ** 2
                state_sub = _state_part(state, names)
                try:
                    applied = unbounded.apply(
                        head_sub,
                        sub,
                        alpha,
                        base=base_sub,
                        state=state_sub,
                        out=None if out is None else {k: out[k] for k in names},
                    )
                except MergeError as exc:  # inputs the rule refuses: this result's
                    applied = f"cannot merge the result: {exc}"
                if isinstance(applied, str):
                    reason = applied
                    break
                weights.update(applied.weights)
                if new_state is not None and applied.state is not None:
                    new_state.update(applied.state)
                busy["merge"] += time.perf_counter() - t
                writing.put(applied.weights)
        if reason is None and bound is not None:
            total = math.sqrt(norm_sq)
            if not total <= bound:
                reason = f"update norm {total:.6g} exceeds max_update_norm {bound:.6g}"
        if reason is not None:
            version.abort()
            return Streamed(None, reason)
        t = time.perf_counter()
        checksum = version.commit()
        busy["write"] += time.perf_counter() - t
    except Unreadable as exc:
        version.abort()
        return Streamed(None, str(exc))
    except BaseException:
        version.abort()
        raise
    return Streamed(Applied(weights, new_state), None, checksum, busy)


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
    for specs in batches(specs_of(head), batch_bytes):
        names = [s.name for s in specs]
        try:
            with _unreadable():
                sub = result.read(names)
        except Unreadable as exc:
            return str(exc)
        head_sub = {k: head[k] for k in names}
        reason = validate_result(head_sub, sub, None)
        if reason is not None:
            return reason
        if bound is not None:
            norm_sq += update_norm(head_sub, sub) ** 2
    if bound is not None and not math.sqrt(norm_sq) <= bound:
        return f"update norm {math.sqrt(norm_sq):.6g} exceeds max_update_norm {bound:.6g}"
    return None


class Unreadable(Exception):
    """A batch of the result (or of its base) could not be read; the message is the reason."""


@contextlib.contextmanager
def _unreadable() -> Iterator[None]:
    """Errors reading a result's batch, as the reason to reject it.

    What a result's bytes or records can raise: the store's errors (missing,
    torn, corrupt, malformed) and the value errors of decoding them. Errors
    of the driver's own writes are not caught here.
    """
    try:
        yield
    except (StoreError, ValueError) as exc:
        raise Unreadable(f"result unreadable: {exc}") from exc


def _bounded(ref: StateDict, sub: StateDict) -> str | None:
    """NaN/Inf in the batch of a result, before its norm is summed."""
    from vcdl.merge.checks import validate_result

    return validate_result(ref, sub, None)


def _state_part(state: StateDict | None, names: list[str]) -> StateDict | None:
    """The rule state's tensors of one batch (with the step count), or None."""
    if state is None:
        return None
    part = {k: state[k] for k in names if k in state}
    if STEP_KEY in state:
        part[STEP_KEY] = state[STEP_KEY]
    return part


def _prefetch(
    read: Callable[[list[str]], _T], jobs: Iterator[list[str]], depth: int = 1
) -> Iterator[_T]:
    """``read(job)`` for each job, one ahead in a thread, yielded in order."""
    q: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for job in jobs:
                if stop.is_set():
                    return
                q.put((True, read(job)))
        except BaseException as exc:
            q.put((False, exc))
            return
        q.put((True, _DONE))

    t = threading.Thread(target=run, name="vcdl-merge-read", daemon=True)
    t.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                assert isinstance(item, BaseException)
                raise item
            if item is _DONE:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while t.is_alive():  # unblock a reader waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.01)


_DONE = object()


class _Stage:
    """A consumer thread fed through a bounded queue; errors surface at the next put or exit."""

    def __init__(self, consume: Callable[[StateDict], None], depth: int) -> None:
        self._consume = consume
        self._q: queue.Queue[StateDict | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vcdl-merge-write", daemon=True)

    def __enter__(self) -> _Stage:
        self._thread.start()
        return self

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            if self._error is None:
                try:
                    self._consume(item)
                except BaseException as exc:
                    self._error = exc

    def put(self, item: StateDict) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(item)

    def __exit__(self, *exc: object) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None and exc[0] is None:
            raise self._error

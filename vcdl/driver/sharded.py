"""One merge (or fold) by K merger processes, each its own range of the version (``merge.mergers``).

This module owns the sharded merge (issue 52, item 1). The version's flat
arrays are cut into K ranges of whole chunks
(:func:`~vcdl.driver.merge_ranges.plan_ranges`). The driver forks K merger
processes (:mod:`vcdl.driver.merger`); each reads its range of the result
(and of the base, and of the rule's state), blends it into its range of the
head by the same :func:`~vcdl.driver.streamed.chain` as one merger, writes
its range's chunks and hashes its tensors (one crossing a boundary is hashed
whole by the merger with its first part). The new weights (and rule state)
land in shared memory, so the driver has the new head without reading it
back. Meanwhile the driver verifies what no merger read whole (the result's
and base's tensors that cross a range boundary); then it publishes the
group's document (the commit point): only when every range is written and
checksummed. The ledger's one
compare-and-swap is the caller's, as for one merger. Every rule is
elementwise, so the bytes are those of one merger, bit for bit.

Why processes forked by the driver, not Dask workers reserved for merging:
the head, the spare buffers and the rule's state are already in the
driver's memory (the head cache); a forked merger reads them for free, and
writes the new head into shared memory the driver keeps as its next head.
Dask mergers would each read their range of the head from the store and
the driver would read the new head back: two more passes over the model's
bytes per merge on a machine whose merge is already near its disk's speed.
A merger touches only torch and the store (a fresh store client, its own
I/O loop after the fork) with one intra-op thread, so the driver's other
threads (Dask, Prefect, logging) are never needed in it.

A merger that dies (killed, out of memory, an error writing) fails this
try: the half-written group is deleted (never published, so never a head)
and the merge is done again from the start, up to :data:`TRIES` times; then
:class:`MergerDied` propagates like any error of the driver's own. A
merger dies with its driver (``PR_SET_PDEATHSIG``); what it wrote is an
unpublished orphan, swept like any other.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import select
import signal
import time
from collections.abc import Callable, Sequence

import torch

from vcdl.driver.merge_ranges import (
    ArrayChunks,
    Piece,
    Placed,
    plan_ranges,
    range_pieces,
    straddling,
)
from vcdl.driver.merger import Job, Report, digest_of, merge_range
from vcdl.driver.streamed import Decoded, Step, Streamed, norm_problem, streamed_fold
from vcdl.errors import StoreError, VcdlError
from vcdl.merge.codec import stored_names
from vcdl.merge.rules import STEP_KEY, Applied, MergeRule, merge_rule
from vcdl.store.streaming import StateReader, StateWriter, batches, specs_of
from vcdl.types import StateDict

_FORK = multiprocessing.get_context("fork")

TRIES = 3
"""How many times a merge is done when a merger dies."""


class MergerDied(VcdlError, RuntimeError):
    """A merger process died, every try; nothing was published."""


def sharded_fold(
    rule: MergeRule,
    head: StateDict,
    steps: Sequence[Step],
    writer: Callable[[], StateWriter],
    *,
    state: StateDict | None,
    out: StateDict | None,
    batch_bytes: int,
    k: int,
) -> Streamed:
    """:func:`~vcdl.driver.streamed.streamed_fold` by ``k`` merger processes (see the module).

    The structure checks are the caller's (done before). The same outcome,
    and for a merge the same bytes, as one merger; ``out`` (if given) is
    moved into shared memory and holds the new weights.
    """
    for _ in range(TRIES):
        got = _once(rule, head, steps, writer, state, out, batch_bytes, k)
        if got is not None:
            return got
    raise MergerDied(f"a merger process died in each of {TRIES} tries of this merge")


def _once(
    rule: MergeRule,
    head: StateDict,
    steps: Sequence[Step],
    writer: Callable[[], StateWriter],
    state: StateDict | None,
    out: StateDict | None,
    batch_bytes: int,
    k: int,
) -> Streamed | None:
    """One try; None when a merger died (nothing published, the group deleted)."""
    version = writer()
    packed, layouts = version.packing
    placed = [Placed(p.name, p.array, p.offset, math.prod(p.shape)) for p in packed]
    arrays = [ArrayChunks(n, a.length, a.chunk_elems, a.itemsize) for n, a in layouts.items()]
    ranges = plan_ranges(arrays, k)
    if len(ranges) < 2 or not _room_in_shm(head, out, rule.keeps_state):
        # Fewer chunks than mergers, or no room to share: one merger does it all.
        version.abort()
        return streamed_fold(
            rule, head, steps, writer, state=state, out=out, batch_bytes=batch_bytes
        )
    split = straddling(placed, ranges)
    pieces = [range_pieces(placed, r) for r in ranges]
    having: dict[str, list[int]] = {}
    for i, got in enumerate(pieces):
        for p in got:
            if p.name in split:
                having.setdefault(p.name, []).append(i)
    shared = out if out is not None else {n: torch.empty_like(t) for n, t in head.items()}
    for t in shared.values():
        if not t.is_shared():
            t.share_memory_()  # in place: the head cache's buffers stay its own
    job = Job(
        rule,
        head,
        steps,
        version,
        placed,
        layouts,
        split,
        {name: (ids[0], ids[1:]) for name, ids in having.items()},
        shared,
        state,
        _shared_state(rule, head, steps, state),
        [_FORK.Semaphore(0) for _ in ranges],
        batch_bytes,
    )
    children: dict[int, tuple[int, int]] = {}  # pid -> (merger, read end)
    try:
        for r in ranges:
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the merger
                os.close(read_end)
                _merger(job, r.index, pieces[r.index], write_end)
            os.close(write_end)
            children[pid] = (r.index, read_end)
        # Meanwhile: the inputs no merger saw whole, verified here.
        # (A vector or scalar across a boundary is read whole, verified, by each merger.)
        problem = _verify_split(steps, {n for n in split if _in_rows(head[n])})
        reports, died = _collect(children)
    except BaseException:
        _kill(children)
        version.abort()
        raise
    if died:
        version.abort()
        return None
    errors = [r.error for r in reports if r.error]
    if errors:
        version.abort()
        raise StoreError(f"a merger failed writing {version.uri}: {errors[0]}")
    refused = [(r.failed or 0, r.reason) for r in reports if r.reason is not None]
    if problem is not None:
        refused.append(problem)
    reason: str | None = None
    failed: int | None = None
    if refused:
        failed, reason = min(refused, key=lambda x: x[0])
    else:
        totals = [sum(r.norm_sq[i] for r in reports) for i in range(len(steps))]
        reason, failed = norm_problem(rule, totals)
    if reason is not None:
        version.abort()
        return Streamed(None, reason, failed=failed)
    t0 = time.perf_counter()
    checksums: dict[str, str] = {}
    for rep in reports:
        checksums.update(rep.checksums)
    for rec in packed:  # empty tensors: no merger had them
        if rec.name not in checksums:
            checksums[rec.name] = digest_of(rec.name, shared[rec.name], version.uri)
    checksum = version.publish([checksums[rec.name] for rec in packed])
    busy = {s: max(r.busy.get(s, 0.0) for r in reports) for s in ("read", "merge", "write")}
    busy["write"] += time.perf_counter() - t0
    weights = {n: shared[n] for n in head}
    new_state: StateDict | None = None
    state_out = job.state_out
    if state_out is not None:
        steps_seen = [r.step for r in reports if r.step is not None]
        # In one merger's order (a stored state's bytes follow it): the first
        # batch's tensors, the step count, then the rest.
        first = {p.name for p in batches(specs_of(head), batch_bytes)[0]}
        new_state = {n: v for n, v in state_out.items() if n in first}
        if steps_seen:
            new_state[STEP_KEY] = torch.tensor(steps_seen[0], dtype=torch.int64)
        new_state.update((n, v) for n, v in state_out.items() if n not in first)
    return Streamed(Applied(weights, new_state), None, checksum, busy)


def _room_in_shm(head: StateDict, out: StateDict | None, keeps_state: bool) -> bool:
    """Whether shared memory (``/dev/shm``) holds the new weights and rule state; if not
    (a container's default 64 MB), say so once and merge with one merger."""
    need = sum(t.nbytes for t in (out or head).values() if out is None or not t.is_shared())
    if keeps_state:  # the momentum: float32 at most twice a half-precision model
        need += 2 * sum(t.nbytes for t in head.values() if t.is_floating_point())
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return True  # not Linux's tmpfs: torch finds its own place
    if st.f_bavail * st.f_frsize >= need + (64 << 20):
        return True
    global _WARNED
    if not _WARNED:
        _WARNED = True
        log.warning(
            "merge.mergers: /dev/shm has %d MB free, the merge needs %d MB of shared memory; "
            "merging with one merger (give the driver more, e.g. docker run --shm-size)",
            st.f_bavail * st.f_frsize >> 20,
            need >> 20,
        )
    return False


_WARNED = False
log = logging.getLogger(__name__)


def _shared_state(
    rule: MergeRule, head: StateDict, steps: Sequence[Step], state: StateDict | None
) -> StateDict | None:
    """Shared buffers for the rule's new state, shaped as the rule makes it.

    Which keys and dtypes a rule's state has is the rule's own affair: it is
    found by running the chain on one element of each tensor (every rule is
    elementwise), then allocated at the head's shapes.
    """
    if not rule.keeps_state:
        return None
    plain = merge_rule(
        rule.settings.model_copy(update={"max_update_norm": None}), workers=rule.workers
    )
    tiny = {n: t.reshape(-1)[:1].clone() for n, t in head.items()}
    sub = (
        None
        if state is None
        else {n: (v if n == STEP_KEY else v.reshape(-1)[:1].clone()) for n, v in state.items()}
    )
    current = tiny
    for step in steps:
        applied = plain.apply(
            current,
            {n: t.clone() for n, t in tiny.items()},
            step.alpha,
            base=tiny if rule.reads_base else None,
            state=sub,
        )
        if isinstance(applied, str):
            raise RuntimeError(f"the rule refused a dry run of its state: {applied}")
        current, sub = applied.weights, applied.state
    assert sub is not None
    return {
        n: torch.empty(head[n].shape, dtype=v.dtype).share_memory_()
        for n, v in sub.items()
        if n != STEP_KEY
    }


def _merger(job: Job, index: int, pieces: list[Piece], fd: int) -> None:
    """A merger process's whole life: its range (:func:`~vcdl.driver.merger.merge_range`),
    its report through the pipe ``fd``, then the end of the process."""
    code = 1
    report = Report()
    try:
        # The driver decides what Ctrl-C (sent to the whole process group) does to a
        # merge, and a stop signal (SIGTERM) just ends a merger: the driver's own
        # handler, which winds a run down, is not a merger's.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _die_with_parent()
        torch.set_num_threads(1)  # K mergers are the parallelism; and fork-safe
        report = merge_range(job, index, pieces, job.version.reopened_groups())
        code = 0
    except BaseException as exc:  # reported, then the process ends
        report = Report(error=f"{type(exc).__name__}: {exc}")
    finally:
        try:
            data = json.dumps(dataclasses.asdict(report)).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.close(fd)
        finally:
            os._exit(code)


def _in_rows(t: torch.Tensor) -> bool:
    """Whether a merger reads its part of ``t`` in rows (as :mod:`.merger` batches it)."""
    return t.dim() >= 2 and t.shape[0] > 1


def _verify_split(steps: Sequence[Step], split: set[str]) -> tuple[int, str] | None:
    """Read whole, verified, the inputs' tensors that cross a range boundary (no merger
    saw all of one); the first step whose input fails, and why."""
    if not split:
        return None
    names = sorted(split)
    for i, step in enumerate(steps):
        jobs: list[tuple[StateReader, list[str]]] = []
        result, base = step.result, step.base
        if isinstance(result, Decoded):
            jobs.append((result._stored, stored_names(names, result._floating, result.precision)))
            if isinstance(result.base, StateReader):
                jobs.append((result.base, names))
        elif isinstance(result, StateReader):
            jobs.append((result, names))
        if isinstance(base, StateReader) and not (
            isinstance(result, Decoded) and base is result.base
        ):
            jobs.append((base, names))
        for reader, wanted in jobs:
            try:
                for name in wanted:
                    reader.read([name])  # one at a time: bounded memory
            except (StoreError, ValueError) as exc:
                return i, f"result unreadable: {exc}"
    return None


def _collect(children: dict[int, tuple[int, int]]) -> tuple[list[Report], bool]:
    """Every merger's report, in range order, and whether any merger died (then the
    others are killed: one may be waiting for the dead one's semaphore)."""
    reports: dict[int, Report] = {}
    pending = {fd: pid for pid, (_, fd) in children.items()}
    got: dict[int, list[bytes]] = {fd: [] for fd in pending}
    while pending:
        ready, _, _ = select.select(list(pending), [], [])
        for fd in ready:
            block = os.read(fd, 1 << 16)
            if block:
                got[fd].append(block)
                continue
            pid = pending.pop(fd)
            index, _ = children.pop(pid)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            data = b"".join(got[fd])
            if not os.WIFEXITED(status) or not data:
                _kill(children)
                return [], True
            # JSON, not pickle: nothing the driver reads back can run code.
            reports[index] = Report(**json.loads(data))
    return [reports[i] for i in sorted(reports)], False


def _kill(children: dict[int, tuple[int, int]]) -> None:
    for pid, (_, fd) in children.items():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.close(fd)
    children.clear()


def _die_with_parent() -> None:
    """The merger gets SIGKILL when its driver dies (Linux; elsewhere it finishes alone)."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)

"""The machine's own limit for a merge: the same bytes read, blended and written, plainly.

``benchmarks/big_merge.py`` measures vcdl's merge; this module measures, in
the same run, what the machine allows for the same work with nothing of
vcdl's in the way, so the merge can be reported as a fraction of it. The
work, on a store written by ``big_merge.write_states``:

* before the clock (as the driver's HeadCache holds them): the head's array
  files read into one flat buffer per dtype, and the spare buffers of the
  next head allocated and touched;
* on the clock, per chunk file of the new version (the head's layout, ~4 MiB
  each): read the same bytes of the result's chunk files (``os.pread``),
  blend them into the spare buffer (``torch.lerp``: ``a * head + (1 - a) *
  result`` in one pass; for an ``int8_delta`` result, ``head + (1 - a) * q *
  scale`` with the stored per-row scales, read first), write the chunk file
  (plain writes into the page cache, **no fsync**: the merge does none either).
  A non-float array (the int64 step counters) is copied.

Three threads per pipeline -- reader, blender, writer, behind queues of two
chunks -- so the three overlap; ``pipelines`` = K splits the version's
chunks into K contiguous ranges, one pipeline each (threads of one process:
file I/O and torch's kernels release the GIL). torch runs one thread per
kernel, as the merge does. With ``sha256`` every chunk read and written is
hashed too (the merge verifies and records a SHA-256 per tensor; these are
the same bytes). Not included: the group documents (a few kB), the
merge's checks of the stored records, its rename-free commit point.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ALPHA = 0.5
NP_DTYPES = {"float32": np.float32, "int64": np.int64, "int8": np.int8}


@dataclass(frozen=True)
class Array:
    """One stored flat array: its dtype's name, length and chunk length."""

    dtype: str
    length: int
    chunk: int

    def chunk_ranges(self) -> list[tuple[int, int, int]]:
        """(chunk index, first element, element count) of each chunk, the last full-size."""
        count = -(-self.length // self.chunk)
        return [(j, j * self.chunk, self.chunk) for j in range(count)]


def arrays(group: Path) -> dict[str, Array]:
    """The flat arrays of a stored state group, by dtype name."""
    out = {}
    for meta in sorted(group.glob("*/zarr.json")):
        doc = json.loads(meta.read_text())
        (length,) = doc["shape"]
        (chunk,) = doc["chunk_grid"]["configuration"]["chunk_shape"]
        out[meta.parent.name] = Array(meta.parent.name, int(length), int(chunk))
    return out


def split_ranges(jobs: list[Any], k: int) -> list[list[Any]]:
    """``jobs`` cut into ``k`` contiguous runs of near-equal length (none empty if k <= n)."""
    n = len(jobs)
    return [jobs[i * n // k : (i + 1) * n // k] for i in range(k)]


def pread_elements(group: Path, arr: Array, start: int, count: int) -> np.ndarray:
    """Elements ``[start, start + count)`` of ``arr``, read from its chunk files."""
    item = np.dtype(NP_DTYPES[arr.dtype]).itemsize
    out = np.empty(count, dtype=NP_DTYPES[arr.dtype])
    view = out.data.cast("B")
    done = 0
    while done < count:
        j, off = divmod(start + done, arr.chunk)
        take = min(count - done, arr.chunk - off)
        fd = os.open(group / arr.dtype / f"c.{j}", os.O_RDONLY)
        try:
            got = os.preadv(fd, [view[done * item : (done + take) * item]], off * item)
        finally:
            os.close(fd)
        if got != take * item:
            raise OSError(f"short read of {arr.dtype}/c.{j}: {got} of {take * item} bytes")
        done += take
    return out


def scaled_rows(q: torch.Tensor, start: int, scales: torch.Tensor, side: int) -> torch.Tensor:
    """``q`` (int8 elements from ``start`` of rows of ``side``) times its rows' scales."""
    out = q.to(torch.float32)
    head = min(len(q), (-start) % side)  # the rest of a row begun in an earlier chunk
    if head:
        out[:head] *= scales[start // side]
    rows = (len(q) - head) // side
    first = (start + head) // side
    if rows:
        out[head : head + rows * side].view(rows, side).mul_(scales[first : first + rows, None])
    tail = len(q) - head - rows * side
    if tail:
        out[len(q) - tail :] *= scales[first + rows]
    return out


@dataclass
class Job:
    """One chunk file of the new version: its array, index and element range."""

    dtype: str
    index: int
    start: int
    count: int


def load_flat(group: Path) -> dict[str, torch.Tensor]:
    """Every array of ``group`` as one flat tensor (the head in memory)."""
    out = {}
    for name, arr in arrays(group).items():
        count = -(-arr.length // arr.chunk) * arr.chunk
        out[name] = torch.from_numpy(pread_elements(group, arr, 0, count))
    return out


def run_limit(
    store_dir: str, source: str, out_name: str, pipelines: int = 1, sha256: bool = False
) -> dict[str, Any]:
    """The plain pipeline over ``store_dir``'s ``head`` and ``source`` (``result`` or
    ``result-int8``); the version written under ``out_name``. Its seconds and each
    stage's busy seconds (summed over pipelines)."""
    torch.set_num_threads(1)
    store = Path(store_dir)
    head_dir, src_dir, out_dir = store / "head", store / source, store / out_name
    head = load_flat(head_dir)
    spare = {k: torch.zeros_like(t) for k, t in head.items()}
    layout = arrays(head_dir)
    src = arrays(src_dir)
    int8 = "int8" in src
    side = _row_length(head_dir)
    jobs = [Job(a.dtype, *r) for a in layout.values() for r in a.chunk_ranges()]
    for a in layout.values():
        (out_dir / a.dtype).mkdir(parents=True, exist_ok=True)
    busy = {"read": 0.0, "blend": 0.0, "write": 0.0}
    lock = threading.Lock()

    def add(stage: str, seconds: float) -> None:
        with lock:
            busy[stage] += seconds

    start = time.perf_counter()
    scales = torch.empty(0)
    if int8:  # the per-row scales: small, read before any row is decoded
        t = time.perf_counter()
        f32 = src["float32"]
        scales = torch.from_numpy(pread_elements(src_dir, f32, 0, f32.length))
        add("read", time.perf_counter() - t)

    def read(job: Job) -> np.ndarray:
        name = "int8" if int8 and job.dtype == "float32" else job.dtype
        arr = src[name]
        count = max(0, min(job.count, arr.length - job.start))  # the padding: not stored
        data = pread_elements(src_dir, arr, job.start, count)
        if sha256:
            hashlib.sha256(data.data.cast("B")).digest()
        return data

    def blend(job: Job, data: np.ndarray) -> None:
        h = head[job.dtype][job.start : job.start + len(data)]
        o = spare[job.dtype][job.start : job.start + len(data)]
        r = torch.from_numpy(data)
        if job.dtype != "float32":
            o.copy_(r)
        elif int8:
            torch.add(h, scaled_rows(r, job.start, scales, side), alpha=1 - ALPHA, out=o)
        else:
            torch.lerp(r, h, ALPHA, out=o)

    def write(job: Job) -> None:
        o = spare[job.dtype][job.start : job.start + job.count]
        data = o.numpy().data.cast("B")
        if sha256:
            hashlib.sha256(data).digest()
        with open(out_dir / job.dtype / f"c.{job.index}", "wb") as f:
            f.write(data)

    threads = [
        threading.Thread(target=_pipeline, args=(part, read, blend, write, add), daemon=True)
        for part in split_ranges(jobs, pipelines)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.perf_counter() - start
    if _FAILED:
        raise _FAILED[0]
    return {"seconds": seconds, "stages": busy}


def _row_length(group: Path) -> int:
    """The last dimension of the group's first tensor with one (big_merge's layer side)."""
    doc = json.loads((group / "zarr.json").read_text())
    for rec in doc["attributes"]["vcdl"]["tensors"].values():
        if rec["shape"]:
            return int(rec["shape"][-1])
    return 1


_DONE = object()
_FAILED: list[BaseException] = []
"""A stage's error, raised by :func:`run_limit` once every thread has ended."""


def _pipeline(
    jobs: list[Job],
    read: Callable[[Job], np.ndarray],
    blend: Callable[[Job, np.ndarray], None],
    write: Callable[[Job], None],
    add: Callable[[str, float], None],
) -> None:
    """Reader here, blender and writer in threads of their own, two chunks between each."""
    to_blend: queue.Queue[Any] = queue.Queue(maxsize=2)
    to_write: queue.Queue[Any] = queue.Queue(maxsize=2)

    def blender() -> None:
        while (item := to_blend.get()) is not _DONE:
            if not _FAILED:  # after an error, drain the queue so the reader ends
                t = time.perf_counter()
                try:
                    blend(*item)
                except BaseException as e:
                    _FAILED.append(e)
                    continue
                add("blend", time.perf_counter() - t)
                to_write.put(item[0])
        to_write.put(_DONE)

    def writer() -> None:
        while (job := to_write.get()) is not _DONE:
            if not _FAILED:
                t = time.perf_counter()
                try:
                    write(job)
                except BaseException as e:
                    _FAILED.append(e)
                add("write", time.perf_counter() - t)

    threads = [threading.Thread(target=blender), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for job in jobs:
        if _FAILED:
            break
        t0 = time.perf_counter()
        try:
            data = read(job)
        except BaseException as e:
            _FAILED.append(e)
            break
        add("read", time.perf_counter() - t0)
        to_blend.put((job, data))
    to_blend.put(_DONE)
    for t in threads:
        t.join()

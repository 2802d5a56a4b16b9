"""Local-disk byte moving for the weight store: chunk files written and read in place.

This module owns the system calls of :class:`vcdl.store.WeightStore` on a
local directory: a chunk is written from the tensors' own memory with
``writev`` and read straight into the destination tensors with ``preadv``
(no intermediate bytes objects, no second copy). Each function is meant to
run in a worker thread; the calls release the GIL. Plain writes, no fsync or
rename: the group's ``zarr.json``, written last, is the commit point, and a
crash before it leaves an orphan (see :mod:`vcdl.store`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from vcdl.errors import IntegrityError
from vcdl.store.layout import ChunkRead

# Linux's IOV_MAX; a chunk of many tiny tensors has more pieces than that.
_IOV_MAX = 1024


def write_file(path: str, data: bytes) -> None:
    """Create or replace ``path`` with ``data``, making its directory if needed."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_chunk(path: str, views: Sequence[memoryview]) -> None:
    """Write the concatenation of ``views`` as the file ``path`` (one writev per 1024)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pending = [v for v in views if v.nbytes]
        while pending:
            batch = pending[:_IOV_MAX]
            done = os.writev(fd, batch)
            pending = _advance(batch, done) + pending[_IOV_MAX:]
    finally:
        os.close(fd)


def read_chunk(path: str, chunk: ChunkRead, uri: str, verify: bool) -> None:
    """Read one chunk file into its destination tensors; check its size (and padding)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        raise IntegrityError(f"{uri}: {chunk.describe()} is missing (torn group)") from None
    try:
        chunk.check_size(os.fstat(fd).st_size, uri)
        for at, views in chunk.runs():
            _preadv_all(fd, views, at, chunk, uri)
        if verify and chunk.pad_from is not None and chunk.pad_from < chunk.array.chunk_bytes:
            chunk.check_padding(os.pread(fd, chunk.array.chunk_bytes, chunk.pad_from), uri)
    finally:
        os.close(fd)


def _preadv_all(fd: int, views: list[memoryview], at: int, chunk: ChunkRead, uri: str) -> None:
    pending = [v for v in views if v.nbytes]
    while pending:
        batch = pending[:_IOV_MAX]
        got = os.preadv(fd, batch, at)
        if got <= 0:  # the file shrank under us
            raise IntegrityError(f"{uri}: {chunk.describe()} ended early (truncated)")
        at += got
        pending = _advance(batch, got) + pending[_IOV_MAX:]


def _advance(views: list[memoryview], done: int) -> list[memoryview]:
    """What is left of ``views`` after the first ``done`` bytes were moved."""
    for i, v in enumerate(views):
        if done < v.nbytes:
            return [v[done:], *views[i + 1 :]]
        done -= v.nbytes
    return []

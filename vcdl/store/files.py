"""Local-disk byte moving for the weight store: chunk files written and read in place.

This module owns the system calls of :class:`vcdl.store.WeightStore` on a
local directory: a chunk is written from the tensors' own memory with
``writev`` and read straight into the destination tensors with ``preadv``
(no intermediate bytes objects, no second copy). A verified read hashes
each piece right after reading it (:func:`read_verified`), a hashed write
right after writing it (:func:`write_hashed`): the bytes are then in the
cache. Each function is meant to run in a worker thread; the calls release
the GIL. Plain writes, no fsync or rename: the group's ``zarr.json``,
written last, is the commit point, and a crash before it leaves an orphan
(see :mod:`vcdl.store`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from vcdl.errors import IntegrityError
from vcdl.store.layout import ChunkRead, ReadTensor, corrupt

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


def write_hashed(chunks: Sequence[tuple[str, Sequence[tuple[memoryview, Any]]]]) -> None:
    """Write each chunk file (its path, then its buffers in order, each with its tensor's
    hasher or None), PIECE_BYTES at a time, hashing each piece right after writing it
    (the write has just brought it into the cache)."""
    for path, pieces in chunks:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            run: list[tuple[memoryview, Any]] = []
            size = 0
            for part in _parts(pieces):
                run.append(part)
                size += part[0].nbytes
                if size >= PIECE_BYTES:
                    _write_run(fd, run)
                    run, size = [], 0
            _write_run(fd, run)
        finally:
            os.close(fd)


def feed(chunks: Sequence[Sequence[tuple[memoryview, Any]]]) -> None:
    """Each buffer into its hasher (if any), in order: what :func:`write_hashed` hashes."""
    for pieces in chunks:
        for view, hasher in pieces:
            if hasher is not None:
                hasher.update(view)


def _parts(pieces: Sequence[tuple[memoryview, Any]]) -> Iterator[tuple[memoryview, Any]]:
    """The buffers cut at most PIECE_BYTES long, in order."""
    for view, hasher in pieces:
        for q in range(0, view.nbytes, PIECE_BYTES):
            yield view[q : q + PIECE_BYTES], hasher


def _write_run(fd: int, run: list[tuple[memoryview, Any]]) -> None:
    """Write a few consecutive parts (one writev per 1024), then hash them."""
    pending = [v for v, _ in run if v.nbytes]
    while pending:
        batch = pending[:_IOV_MAX]
        done = os.writev(fd, batch)
        pending = _advance(batch, done) + pending[_IOV_MAX:]
    for view, hasher in run:
        if hasher is not None:
            hasher.update(view)


def read_chunk(path: str, chunk: ChunkRead, uri: str, verify: bool) -> None:
    """Read one chunk file into its destination tensors; check its size (and padding)."""
    fd = _open(path, chunk, uri)
    try:
        chunk.check_size(os.fstat(fd).st_size, uri)
        for at, views in chunk.runs():
            _preadv_all(fd, views, at, chunk, uri)
        if verify and chunk.pad_from is not None and chunk.pad_from < chunk.array.chunk_bytes:
            chunk.check_padding(os.pread(fd, chunk.array.chunk_bytes, chunk.pad_from), uri)
    finally:
        os.close(fd)


PIECE_BYTES = 256 << 10
"""Bytes read, then hashed at once while still in the core's cache. Measured here
(2026-11-29, 2 MiB of L2 a core): SHA-256 at 1.1 GB/s over 64 MB written long before,
2.0 GB/s over 4 MB just touched; reading and verifying a 400-MB result took 0.60 s
of CPU hashed after the reads, 0.54 s in 1-MiB pieces, 0.49 s in 256-KiB ones; writing
and hashing 64 MB, 124 ms apart, 101 ms a 256-KiB piece at a time."""


def read_verified(
    root: str, tensors: Sequence[ReadTensor], chunks: Mapping[tuple[str, int], ChunkRead], uri: str
) -> None:
    """Read ``tensors`` from the chunk files under ``root`` and check them against their
    checksums (None: not checked), each in order a piece at a time, every piece hashed
    right after it is read. ``chunks``: the plan's, by array and index (for the checks
    and messages of :func:`read_chunk`)."""
    layouts = {node: c.array for (node, _), c in chunks.items()}
    for t in tensors:
        hasher = hashlib.sha256() if t.checksum is not None else None
        pos, n = 0, t.data.nbytes
        while pos < n:
            layout = layouts[t.array]
            j, at = divmod(t.offset * layout.itemsize + pos, layout.chunk_bytes)
            take = min(n - pos, layout.chunk_bytes - at)
            chunk = chunks[(t.array, j)]
            fd = _open(os.path.join(root, chunk.key), chunk, uri)
            try:
                chunk.check_size(os.fstat(fd).st_size, uri)
                for q in range(pos, pos + take, PIECE_BYTES):
                    piece = t.data[q : min(q + PIECE_BYTES, pos + take)]
                    _preadv_all(fd, [piece], at + q - pos, chunk, uri)
                    if hasher is not None:
                        hasher.update(piece)
            finally:
                os.close(fd)
            pos += take
        if hasher is not None and hasher.hexdigest() != t.checksum:
            raise corrupt(uri, t.name, t.array, t.offset)


def check_chunk(path: str, chunk: ChunkRead, uri: str) -> None:
    """A chunk's size and padding (zeros after the array's last byte), as :func:`read_chunk`
    checks them, without reading its pieces."""
    fd = _open(path, chunk, uri)
    try:
        chunk.check_size(os.fstat(fd).st_size, uri)
        if chunk.pad_from is not None and chunk.pad_from < chunk.array.chunk_bytes:
            chunk.check_padding(os.pread(fd, chunk.array.chunk_bytes, chunk.pad_from), uri)
    finally:
        os.close(fd)


def _open(path: str, chunk: ChunkRead, uri: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        raise IntegrityError(f"{uri}: {chunk.describe()} is missing (torn group)") from None


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

"""A shard's rows streamed from the store one block (chunk) at a time, with read-ahead.

This module owns the reading of training data larger than a worker's split
cache (``data.cache_mb``): the shard's rows are grouped by the stored chunk
they lie in (a block), and blocks are read and decoded one at a time, in the
order training asks for them, by a thread that stays at most ``ahead``
blocks in front. At most ``ahead + 2`` blocks are in memory at once (the
queue, the one being read, the one being trained on); the split is never
held whole, nor the shard.

It also counts the bytes fetched from the store (:class:`ByteCounter`), as
the object store bills them: what each chunk read returned, compressed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

Arrays = dict[str, np.ndarray]


class ByteCounter:
    """Bytes (and the requests that returned them) to or from a store, summed over threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0
        self.requests = 0

    def add(self, n: int, requests: int = 1) -> None:
        with self._lock:
            self.bytes += n
            self.requests += requests


class CountingStore(WrapperStore[Store]):
    """A read-through Zarr store that adds the size of everything it returns to a counter."""

    def __init__(self, store: Store, counter: ByteCounter) -> None:
        super().__init__(store)
        self.counter = counter

    def _with_store(self, store: Store) -> CountingStore:
        return type(self)(store, self.counter)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        got = await self._store.get(key, prototype, byte_range)
        if got is not None:
            self.counter.add(len(got))
        return got

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Any
    ) -> list[Buffer | None]:
        got = await self._store.get_partial_values(prototype, key_ranges)
        self.counter.add(sum(len(b) for b in got if b is not None), len(got))
        return got


def counted(array: zarr.Array, counter: ByteCounter) -> zarr.Array:
    """The same stored array, opened again through a :class:`CountingStore`."""
    return zarr.open_array(CountingStore(array.store, counter), path=array.path, mode="r")


def group_by_chunk(indices: np.ndarray, rows_per_chunk: int) -> list[np.ndarray]:
    """``indices`` grouped by the chunk they lie in: one block per chunk, chunks ascending.

    Within a block the rows keep their given order. Any plan reads each
    chunk it touches once per pass; the chunk-aligned plan touches about its
    share of them, the row plan all of them.
    """
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size == 0:
        return []
    chunk = idx // rows_per_chunk
    order = np.argsort(chunk, kind="stable")
    idx, chunk = idx[order], chunk[order]
    cuts = np.flatnonzero(chunk[1:] != chunk[:-1]) + 1
    return np.split(idx, cuts)


class ShardStream:
    """A shard's rows as blocks read on demand from the stored split's arrays.

    ``arrays`` are the split's Zarr arrays by field (opened through a
    :class:`CountingStore` on ``counter``, so :attr:`bytes_read` is what was
    fetched); ``indices`` the shard's rows (any order).
    """

    def __init__(
        self,
        arrays: Mapping[str, zarr.Array],
        indices: np.ndarray,
        rows_per_chunk: int,
        *,
        counter: ByteCounter | None = None,
        ahead: int = 2,
    ) -> None:
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1 block, got {ahead}")
        self._arrays = dict(arrays)
        self._blocks = group_by_chunk(indices, rows_per_chunk)
        self._rows_per_chunk = rows_per_chunk
        self.counter = counter if counter is not None else ByteCounter()
        self.ahead = ahead

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self._arrays)

    @property
    def sizes(self) -> list[int]:
        """Rows of each block."""
        return [len(b) for b in self._blocks]

    @property
    def rows(self) -> int:
        return sum(self.sizes)

    @property
    def bytes_read(self) -> int:
        return self.counter.bytes

    def read_block(self, i: int) -> Arrays:
        """Block ``i``'s rows by field, in their order: one chunk read per field."""
        rows = self._blocks[i]
        lo = int(rows.min()) // self._rows_per_chunk * self._rows_per_chunk
        hi = int(rows.max()) + 1
        local = rows - lo
        # A slice inside one chunk: exactly that chunk is fetched and decoded.
        return {f: np.asarray(a[lo:hi])[local] for f, a in self._arrays.items()}

    def blocks(self, order: Sequence[int] | None = None) -> Generator[Arrays, None, None]:
        """The blocks in ``order`` (default: by chunk), read ahead by a thread.

        Closing the iterator early (or an exception in the consumer) stops the
        reader after the block it is reading.
        """
        wanted = list(range(len(self._blocks))) if order is None else [int(i) for i in order]
        if not wanted:
            return
        slots: queue.Queue[tuple[Arrays | None, BaseException | None]] = queue.Queue(self.ahead)
        stop = threading.Event()

        def read() -> None:
            for i in wanted:
                if stop.is_set():
                    return
                try:
                    item: tuple[Arrays | None, BaseException | None] = (self.read_block(i), None)
                except BaseException as exc:  # handed to the consumer, raised there
                    item = (None, exc)
                while not stop.is_set():
                    try:
                        slots.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if item[1] is not None:
                    return

        reader = threading.Thread(target=read, name="vcdl-shard-read-ahead", daemon=True)
        reader.start()
        try:
            for _ in wanted:
                block, error = slots.get()
                if error is not None:
                    raise error
                assert block is not None
                yield block
        finally:
            stop.set()
            reader.join()

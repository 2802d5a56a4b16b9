"""Streaming a shard block by block: blocks are chunks, read-ahead is bounded, batches cover
every row once per local epoch, and a resumed epoch sees the batches an uninterrupted one does."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.data.stream import ByteCounter, ShardStream, counted, group_by_chunk
from vcdl.worker.loop import _streamed_batches


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 500), st.integers(1, 60), st.integers(0, 2**32))
def test_blocks_are_the_chunks_the_rows_lie_in(n: int, rpc: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    idx = rng.permutation(n)[: rng.integers(1, n + 1)]
    blocks = group_by_chunk(idx, rpc)
    assert np.array_equal(np.sort(np.concatenate(blocks)), np.sort(idx))
    chunks = [int(b[0]) // rpc for b in blocks]
    assert chunks == sorted(set(chunks))  # one block per chunk
    for b in blocks:
        assert (b // rpc == b[0] // rpc).all()


def _stored(tmp_path: Path, rows: int = 1000, rpc: int = 100) -> dict[str, zarr.Array]:
    g = zarr.open_group(str(tmp_path), mode="w")
    g.create_array("x", data=np.arange(rows * 3, dtype="f4").reshape(rows, 3), chunks=(rpc, 3))
    g.create_array("y", data=np.arange(rows, dtype="i8"), chunks=(rpc,))
    r = zarr.open_group(zarr.storage.LocalStore(str(tmp_path), read_only=True), mode="r")
    return {f: r[f] for f in ("x", "y")}  # type: ignore[misc]


def test_stream_reads_each_touched_chunk_once_and_counts_its_bytes(tmp_path: Path) -> None:
    arrays = _stored(tmp_path)
    counter = ByteCounter()
    wrapped = {f: counted(a, counter) for f, a in arrays.items()}
    opened, requests = counter.bytes, counter.requests
    rows = np.array([950, 5, 7, 420, 3, 999])
    stream = ShardStream(wrapped, rows, 100, counter=counter)
    assert stream.sizes == [3, 1, 2] and stream.rows == 6
    got = list(stream.blocks())
    assert [b["y"].tolist() for b in got] == [[5, 7, 3], [420], [950, 999]]
    assert np.array_equal(got[0]["x"][:, 0], np.array([15, 21, 9], dtype="f4"))
    # Exactly the three chunks of each array, as stored (compressed): six GETs.
    files = [tmp_path / "x" / "c" / str(c) / "0" for c in (0, 4, 9)]
    files += [tmp_path / "y" / "c" / str(c) for c in (0, 4, 9)]
    assert counter.bytes - opened == sum(f.stat().st_size for f in files)
    assert counter.requests - requests == 6


class _Recording(ShardStream):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.read: list[int] = []
        self.lock = threading.Lock()

    def read_block(self, i: int) -> dict[str, np.ndarray]:
        with self.lock:
            self.read.append(i)
        return super().read_block(i)


def test_read_ahead_is_bounded_and_stops_when_the_consumer_does(tmp_path: Path) -> None:
    arrays = _stored(tmp_path)
    stream = _Recording(arrays, np.arange(1000), 100, ahead=2)
    blocks = stream.blocks()
    first = next(blocks)
    assert first["y"][0] == 0
    # Wait until the reader is blocked on the full queue.
    for _ in range(200):
        if len(stream.read) >= 4:
            break
        threading.Event().wait(0.01)
    # One consumed, two queued, one read and waiting for a slot: never more.
    assert len(stream.read) <= 1 + 2 + 1
    blocks.close()
    assert not any(t.name == "vcdl-shard-read-ahead" for t in threading.enumerate())
    assert len(stream.read) <= 4


def test_a_read_error_reaches_the_consumer(tmp_path: Path) -> None:
    arrays = _stored(tmp_path)

    class Failing(ShardStream):
        def read_block(self, i: int) -> dict[str, np.ndarray]:
            if i == 2:
                raise OSError("store went away")
            return super().read_block(i)

    with pytest.raises(OSError, match="went away"):
        list(Failing(arrays, np.arange(1000), 100).blocks())


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 300), st.integers(1, 50), st.integers(1, 64), st.data())
def test_streamed_batches_cover_the_shard_once_and_resume_exactly(
    n: int, rpc: int, batch: int, data: st.DataObject
) -> None:
    rows = np.arange(n)
    y = np.arange(n, dtype="i8")

    class Memory(ShardStream):  # the same blocks, from memory: no store needed
        def read_block(self, i: int) -> dict[str, np.ndarray]:
            return {"y": y[self._blocks[i]]}

    stream = Memory({"y": None}, rows, rpc)  # type: ignore[dict-item]
    order = torch.randperm(len(stream.sizes), generator=torch.Generator().manual_seed(1)).tolist()
    device = torch.device("cpu")
    whole = list(_streamed_batches(stream, ("y",), order, 7, 0, 0, batch, device))
    seen = torch.cat([b["y"] for b in whole])
    assert sorted(seen.tolist()) == list(range(n))
    assert all(len(b["y"]) == batch for b in whole[:-1]) and 0 < len(whole[-1]["y"]) <= batch
    # A checkpoint after k batches: the rest are the same batches.
    k = data.draw(st.integers(0, len(whole)))
    rest = list(_streamed_batches(stream, ("y",), order, 7, 0, min(n, k * batch), batch, device))
    assert len(rest) == len(whole) - k
    for a, b in zip(rest, whole[k:], strict=True):
        assert torch.equal(a["y"], b["y"])

# ruff: noqa: F811  (the backend and store fixtures are imported by name from test_store)
"""Streamed state groups (vcdl.store.streaming) on every backend: the same bytes as write_state.

A group written a few tensors at a time must be the group ``write_state``
writes, file for file; a subset read must equal the whole read, verify its
checksums and fetch only its tensors; a writer that aborts leaves nothing
readable.
"""

from __future__ import annotations

import pytest
import torch

from tests.contract.test_store import (
    EXACT_DTYPES,
    Backend,
    assert_same_state,
    chunk_key,
    resnet_like,
    sample,
)
from vcdl.errors import IntegrityError, StoreError, StoreNotFoundError
from vcdl.store import WeightStore
from vcdl.store import layout as store_layout
from vcdl.store.streaming import batches, specs_of
from vcdl.types import StateDict

# Fixtures used by name (defined in test_store.py).
from tests.contract.test_store import backend, store  # noqa: F401  isort: skip
from tests.s3fixture import s3_bucket_url, s3_endpoint  # noqa: F401  isort: skip


def mixed_state() -> StateDict:
    """Every exact dtype, tensors spanning chunks and sharing them, and empties."""
    state: StateDict = {}
    for i, dtype in enumerate(EXACT_DTYPES):
        name = str(dtype).removeprefix("torch.")
        state[f"{name}.small"] = sample(dtype, (3, 5), seed=i)
        state[f"{name}.empty"] = sample(dtype, (0, 4), seed=i)
        state[f"{name}.scalar"] = sample(dtype, (), seed=i + 50)
    state["big.float32"] = sample(torch.float32, (700, 1000), seed=7)  # 2.8 MB
    state["after.float32"] = sample(torch.float32, (300, 500), seed=8)
    state["big.bfloat16"] = sample(torch.bfloat16, (1200, 1000), seed=9)
    return state


def _write_streamed(store: WeightStore, path: str, state: StateDict, limit: int) -> str:
    writer = store.writer(path, specs_of(state), attrs={"n": 1})
    for batch in batches(specs_of(state), limit):
        writer.write({s.name: state[s.name] for s in batch})
    return writer.commit()


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many chunks per array, and tensors cut by chunk and batch boundaries.
    monkeypatch.setattr(store_layout, "CHUNK_BYTES", 1 << 20)


@pytest.mark.parametrize("limit", [1, 300_000, 1 << 30], ids=["tensor-by-tensor", "300KB", "one"])
def test_a_streamed_group_is_the_group_write_state_writes(
    backend: Backend, store: WeightStore, limit: int
) -> None:
    state = mixed_state()
    store.write_state("whole", state, attrs={"n": 1})
    checksum = _write_streamed(store, "streamed", state, limit)
    assert checksum == store.checksum("whole") == store.checksum("streamed")
    assert_same_state(store.read_state("streamed"), state)
    # Byte for byte: the group document and every chunk.
    assert backend.read_raw("streamed/zarr.json") == backend.read_raw("whole/zarr.json")
    for name in state:
        key, _ = chunk_key(store, "whole", name)
        assert backend.read_raw(key.replace("whole/", "streamed/", 1)) == backend.read_raw(key)


def test_a_subset_read_equals_the_whole_and_is_verified(
    backend: Backend, store: WeightStore
) -> None:
    state = mixed_state()
    store.write_state("v", state)
    reader = store.reader("v")
    assert [s.name for s in reader.specs] == list(state)
    assert reader.checksum() == store.checksum("v")
    wanted = ["big.bfloat16", "int64.small", "float32.scalar"]
    assert_same_state(reader.read(wanted), {k: state[k] for k in wanted})
    # A corrupted chunk of one tensor fails the batch that holds it, not another.
    key, at = chunk_key(store, "v", "after.float32")
    raw = bytearray(backend.read_raw(key))
    raw[at] ^= 0xFF
    backend.write_raw(key, bytes(raw))
    fresh = store.reader("v")
    assert_same_state(fresh.read(["int64.small"]), {"int64.small": state["int64.small"]})
    with pytest.raises(IntegrityError, match=r"after\.float32"):
        fresh.read(["after.float32"])


def test_a_writer_refuses_tensors_out_of_order_and_an_aborted_one_leaves_nothing(
    store: WeightStore,
) -> None:
    state = resnet_like()
    writer = store.writer("v", specs_of(state))
    names = list(state)
    with pytest.raises(StoreError, match="expected tensor"):
        writer.write({names[1]: state[names[1]]})
    writer.write({names[0]: state[names[0]]})
    with pytest.raises(StoreError, match="never written"):
        writer.commit()
    writer.abort()
    assert not store.exists("v")
    with pytest.raises(StoreNotFoundError):
        store.reader("v")


def test_an_uncommitted_writer_leaves_an_orphan_never_a_group(store: WeightStore) -> None:
    state = mixed_state()
    writer = store.writer("runs/r/versions/3", specs_of(state))
    writer.write({k: state[k] for k in list(state)[:10]})
    # The process dies here: chunks are written, the group document is not.
    assert not store.exists("runs/r/versions/3")
    assert store.list("runs/r/versions") == ["3"]  # an orphan for the sweeper

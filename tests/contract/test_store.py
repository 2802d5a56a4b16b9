"""Contract of :class:`vcdl.store.WeightStore`, run on every backend.

Backends: a local directory and S3 on a loopback moto server (marker ``s3``).
Each test gets a fresh store (a new tmp dir or a new bucket). Raw byte access
(``Backend.read_raw`` / ``write_raw``) goes around the store to simulate disk
corruption and torn writes; the crash before the completion marker is
simulated by making the store's commit step fail. Groups of the older format
1 (one array per tensor) are built with plain zarr and must stay readable.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.s3fixture import make_bucket, s3_bucket_url, s3_endpoint, s3_storage_options
from vcdl.errors import IntegrityError, StoreError, StoreNotFoundError
from vcdl.store import WeightStore, open_store
from vcdl.store import files as store_files
from vcdl.store import layout as store_layout
from vcdl.store.layout import CHECKSUM_ALGORITHM, FORMAT, READABLE_FORMATS
from vcdl.types import StateDict

# Fixtures imported for their side effect (pytest finds them by name).
__all__ = ["s3_bucket_url", "s3_endpoint"]

EXACT_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
]


# ------------------------------------------------------------------ helpers


class Backend:
    """Where a test's store lives, plus raw access to its bytes."""

    def __init__(self, kind: str, url: str, options: dict[str, Any] | None) -> None:
        self.kind = kind
        self.url = url
        self.options = options
        self._fs: Any = None
        if kind == "s3":
            import fsspec

            assert options is not None
            self._fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)

    def store(self) -> WeightStore:
        return WeightStore(self.url, self.options)

    def _where(self, key: str) -> str:
        if self.kind == "local":
            return os.path.join(self.url, key)
        return f"{self.url.removeprefix('s3://')}/{key}"

    def read_raw(self, key: str) -> bytes:
        if self._fs is None:
            return Path(self._where(key)).read_bytes()
        return bytes(self._fs.cat_file(self._where(key)))

    def write_raw(self, key: str, data: bytes) -> None:
        if self._fs is None:
            Path(self._where(key)).write_bytes(data)
        else:
            self._fs.pipe_file(self._where(key), data)

    def delete_raw(self, key: str) -> None:
        if self._fs is None:
            Path(self._where(key)).unlink()
        else:
            self._fs.rm_file(self._where(key))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return Backend("local", str(tmp_path / "store"), None)
    url, options = request.getfixturevalue("s3_bucket_url")
    return Backend("s3", url, options)


@pytest.fixture
def store(backend: Backend) -> WeightStore:
    return backend.store()


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so NaN payloads and -0.0 compare exactly."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same_state(got: StateDict, want: StateDict) -> None:
    assert list(got) == list(want)  # same names, same order
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, name
        assert g.shape == w.shape, name
        assert g.device.type == "cpu"
        assert torch.equal(bits(g), bits(w)), name


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        wide = torch.complex64 if dtype.is_complex else torch.float32
        t = (torch.randn(shape, generator=gen, dtype=wide) * 3).to(dtype)
        if t.numel() >= 3 and not dtype.is_complex and dtype != torch.float8_e4m3fn:
            flat = t.view(-1)
            flat[0], flat[1], flat[2] = float("nan"), float("-inf"), -0.0
        return t
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=gen).to(dtype)


def resnet_like(width: int = 4, blocks: tuple[int, ...] = (2, 2, 2, 2)) -> StateDict:
    """A ResNet-shaped state dict: convs, BatchNorm (with int64 counters), fc."""
    sd: StateDict = {}
    gen = torch.Generator().manual_seed(1)

    def conv(name: str, cout: int, cin: int, k: int) -> None:
        sd[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=gen)

    def bn(name: str, c: int) -> None:
        sd[f"{name}.weight"] = torch.rand(c, generator=gen)
        sd[f"{name}.bias"] = torch.randn(c, generator=gen)
        sd[f"{name}.running_mean"] = torch.randn(c, generator=gen)
        sd[f"{name}.running_var"] = torch.rand(c, generator=gen)
        sd[f"{name}.num_batches_tracked"] = torch.tensor(123)

    conv("conv1", width, 3, 7)
    bn("bn1", width)
    cin = width
    for li, n in enumerate(blocks, 1):
        planes = width * 2 ** (li - 1)
        for b in range(n):
            p = f"layer{li}.{b}"
            conv(f"{p}.conv1", planes, cin, 3)
            bn(f"{p}.bn1", planes)
            conv(f"{p}.conv2", planes, planes, 3)
            bn(f"{p}.bn2", planes)
            if b == 0 and cin != planes:
                conv(f"{p}.downsample.0", planes, cin, 1)
                bn(f"{p}.downsample.1", planes)
            cin = planes
    sd["fc.weight"] = torch.randn(10, cin, generator=gen)
    sd["fc.bias"] = torch.randn(10, generator=gen)
    return sd


def chunk_key(store: WeightStore, path: str, tensor: str) -> tuple[str, int]:
    """Store key of the chunk holding ``tensor``'s first byte, and the byte's offset in it.

    Found through plain zarr: the array named by the tensor's record, its
    chunk grid and the record's element offset.
    """
    rec = vcdl_attrs(store, path)["tensors"][tensor]
    arr = store.open_group(path)[rec["array"]]
    assert isinstance(arr, zarr.Array)
    index, at = divmod(rec["offset"], arr.chunks[0])
    key = f"{path}/{rec['array']}/{arr.metadata.encode_chunk_key((index,))}"
    return key, at * arr.dtype.itemsize


def vcdl_attrs(store: WeightStore, path: str) -> dict[str, Any]:
    attrs = store.open_group(path).attrs["vcdl"]
    assert isinstance(attrs, dict)
    return attrs


# ------------------------------------------------------------ round trips


@pytest.mark.parametrize("dtype", EXACT_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_every_dtype_round_trips_exactly(store: WeightStore, dtype: torch.dtype) -> None:
    state = {
        "matrix": sample(dtype, (3, 5)),
        "scalar": sample(dtype, (), seed=1),
        "empty": sample(dtype, (0,)),
        "empty3d": sample(dtype, (2, 0, 3)),
        "conv": sample(dtype, (4, 2, 3, 3), seed=2),
    }
    store.write_state("v/1", state)
    assert_same_state(store.read_state("v/1"), state)
    assert store.read_state("v/1")["scalar"].shape == ()


def test_dotted_names_and_order_round_trip(store: WeightStore) -> None:
    names = ["z.last.first", "layer1.0.bn1.running_mean", "a", "layer1.0.bn1.weight", "0.1"]
    state = {n: torch.full((2,), float(i)) for i, n in enumerate(names)}
    uri = store.write_state("runs/r/versions/v0", state)
    assert uri == store.uri("runs/r/versions/v0")
    assert_same_state(store.read_state("runs/r/versions/v0"), state)


def test_awkward_tensor_names_round_trip(store: WeightStore) -> None:
    names = [
        "has/slash",
        "__dunder",
        "zarr.json",
        ".hidden",
        "-dash",
        "-0",  # looks like an encoded node name
        "c",
        "fc.W",
        "fc.w",  # differs only in case: distinct nodes on any file system
        "ünïcode.β",
        "space and %25 percent",
        "x" * 300,
        "..",
    ]
    state = {n: torch.tensor([i]) for i, n in enumerate(names)}
    store.write_state("g", state)
    assert_same_state(store.read_state("g"), state)
    # Names live only in the group's attributes: never file or node names.
    assert list(store.open_group("g").keys()) == ["int64"]
    assert list(vcdl_attrs(store, "g")["tensors"]) == names


def test_non_contiguous_and_grad_tensors(store: WeightStore) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    param = torch.nn.Parameter(torch.randn(3, 3))
    state = {
        "transposed": base.t(),
        "strided": base[::2, 1::2],
        "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),
        "offset": base[1:, 2:],
        "param": param,
        "grad_result": param * 2,
        "conj": torch.tensor([1 + 2j], dtype=torch.complex64).conj(),
    }
    store.write_state("v", state)
    got = store.read_state("v")
    for name, t in state.items():
        assert torch.equal(got[name], t.detach().resolve_conj()), name
        assert got[name].is_contiguous() and not got[name].requires_grad


def test_resnet_like_state_round_trips(store: WeightStore) -> None:
    state = resnet_like()
    assert len(state) > 100
    store.write_state("runs/r/versions/v3", state, attrs={"number": 3})
    assert_same_state(store.read_state("runs/r/versions/v3"), state)
    assert store.read_attrs("runs/r/versions/v3") == {"number": 3}


def test_read_tensors_are_writable_and_independent(store: WeightStore) -> None:
    state = {"w": torch.zeros(4), "v": torch.ones(3), "s": torch.tensor(2.0)}
    store.write_state("v", state)
    first = store.read_state("v")
    first["w"] += 1  # must not warn or fail (own, writable memory)
    assert torch.equal(store.read_state("v")["w"], torch.zeros(4))
    # Packed on the store, but each tensor read owns its memory (a tensor kept,
    # saved or exported alone does not drag the others along).
    storages = {t.untyped_storage().data_ptr() for t in first.values()}
    assert len(storages) == len(first)
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in first.values())


# ----------------------------------------------------- metadata and attrs


def test_attrs_and_layout(store: WeightStore) -> None:
    state = {"a.w": torch.ones(2, 3), "b": torch.tensor(1, dtype=torch.bfloat16)}
    attrs = {"run": "r", "number": 7, "alpha": 0.5, "tags": ["x", "y"], "nested": {"k": None}}
    store.write_state("v", state, attrs=attrs)
    assert store.read_attrs("v") == attrs
    doc = vcdl_attrs(store, "v")
    assert doc["format"] == FORMAT == 2
    assert READABLE_FORMATS == (1, 2)
    assert doc["complete"] is True
    assert doc["checksum_algorithm"] == CHECKSUM_ALGORITHM == "sha256"
    assert doc["attrs"] == attrs
    assert list(doc["tensors"]) == ["a.w", "b"]
    assert doc["tensors"]["a.w"]["dtype"] == "float32"
    assert doc["tensors"]["a.w"]["shape"] == [2, 3]
    assert doc["tensors"]["b"]["dtype"] == "bfloat16"
    assert doc["tensors"]["b"]["shape"] == []
    assert doc["tensors"]["a.w"]["array"] == "float32"
    assert doc["tensors"]["b"]["array"] == "bfloat16"
    assert [rec["offset"] for rec in doc["tensors"].values()] == [0, 0]
    assert all(len(rec["checksum"]) == 64 for rec in doc["tensors"].values())


def test_groups_are_plain_zarr(store: WeightStore) -> None:
    """Any Zarr v3 reader sees one flat uncompressed array per dtype; tensors are slices."""
    state = {
        "w": torch.randn(3, 4),
        "n": torch.tensor(5),
        "m": torch.tensor([True, False]),
        "b": torch.randn(2, 2),
        "h": torch.randn(5).to(torch.bfloat16),
    }
    store.write_state("v", state)
    group = store.open_group("v")
    assert group.metadata.consolidated_metadata is not None
    assert set(group.metadata.consolidated_metadata.metadata) == {
        "float32",
        "int64",
        "bool",
        "bfloat16",
    }
    records = vcdl_attrs(store, "v")["tensors"]
    for name, t in state.items():
        rec = records[name]
        arr = group[rec["array"]]
        assert isinstance(arr, zarr.Array)
        assert arr.ndim == 1 and arr.compressors == ()
        flat = np.asarray(arr[rec["offset"] : rec["offset"] + t.numel()])
        want = t.view(torch.int16) if t.dtype == torch.bfloat16 else t  # bits of bfloat16
        np.testing.assert_array_equal(flat.reshape(t.shape), want.numpy())
    assert group["float32"].shape == (16,)  # w then b, packed in state order


def test_attrs_must_be_json(store: WeightStore) -> None:
    with pytest.raises(StoreError, match="JSON"):
        store.write_state("v", {"w": torch.ones(1)}, attrs={"t": torch.ones(1)})
    assert not store.exists("v")


def test_checksum(store: WeightStore) -> None:
    state = {"a": torch.arange(5.0), "b": torch.ones(2, dtype=torch.int64)}
    store.write_state("x", state)
    store.write_state("y", dict(reversed(list(state.items()))), attrs={"other": True})
    c = store.checksum("x")
    assert isinstance(c, str) and len(c) == 64
    assert store.checksum("y") == c  # content only: not order, path or attrs
    store.write_state("z", {"a": torch.arange(5.0) + 1e-6, "b": state["b"]})
    assert store.checksum("z") != c
    store.write_state("w", {"a": torch.arange(5.0).double(), "b": state["b"]})
    assert store.checksum("w") != c  # dtype counts


def test_invalid_states_are_refused(store: WeightStore) -> None:
    with pytest.raises(StoreError, match="not a tensor"):
        store.write_state("v", {"a": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(StoreError, match="names"):
        store.write_state("v", {1: torch.ones(1)})  # type: ignore[dict-item]
    with pytest.raises(StoreError, match="dense"):
        store.write_state("v", {"s": torch.eye(2).to_sparse()})
    with pytest.raises(StoreError, match="CPU"):
        store.write_state("v", {"m": torch.empty(2, device="meta")})
    assert not store.exists("v")


# ------------------------------------------------- overwrite, crash, delete


def test_overwrite_replaces_the_group(store: WeightStore) -> None:
    old = {"a": torch.ones(3), "old.only": torch.zeros(2, dtype=torch.float64)}
    store.write_state("v", old, {"n": 1})
    new = {"a": torch.full((4,), 2.0), "b": torch.tensor(3)}
    store.write_state("v", new, {"n": 2})
    assert_same_state(store.read_state("v"), new)
    assert store.read_attrs("v") == {"n": 2}
    assert sorted(store.open_group("v").keys()) == ["float32", "int64"]  # no leftover arrays
    c = store.checksum("v")
    store.write_state("v", new, {"n": 2})  # idempotent
    assert store.checksum("v") == c
    assert_same_state(store.read_state("v"), new)


def _crash_before_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    async def crash(self: WeightStore, rel: str, doc: bytes) -> None:
        raise RuntimeError("simulated crash before the completion marker")

    monkeypatch.setattr(WeightStore, "_publish", crash)


def test_crashed_write_leaves_an_orphan(
    store: WeightStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {"a": torch.ones(3), "b": torch.zeros(2, 2)}
    store.write_state("runs/r/v0", state)
    with monkeypatch.context() as m:
        _crash_before_commit(m)
        with pytest.raises(StoreError, match="simulated crash"):
            store.write_state("runs/r/v1", state)
    assert not store.exists("runs/r/v1")
    assert store.list("runs/r") == ["v0", "v1"]  # orphans are listed
    for read in (store.read_state, store.read_attrs, store.checksum):
        with pytest.raises(StoreNotFoundError, match="runs/r/v1"):
            read("runs/r/v1")
    # A retry of the write completes the group; so does a delete clean it up.
    store.write_state("runs/r/v1", state)
    assert_same_state(store.read_state("runs/r/v1"), state)
    with monkeypatch.context() as m:
        _crash_before_commit(m)
        with pytest.raises(StoreError):
            store.write_state("runs/r/v2", state)
    store.delete("runs/r/v2")
    assert store.list("runs/r") == ["v0", "v1"]


def test_crash_while_overwriting_is_not_a_torn_group(
    store: WeightStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write_state("v", {"a": torch.ones(3)})
    with monkeypatch.context() as m:
        _crash_before_commit(m)
        with pytest.raises(StoreError):
            store.write_state("v", {"a": torch.zeros(3), "b": torch.ones(1)})
    # Never the old marker over new arrays: the group is simply not there.
    assert not store.exists("v")
    with pytest.raises(StoreNotFoundError):
        store.read_state("v")


def test_delete(store: WeightStore) -> None:
    store.delete("never/written")  # absent: fine
    store.write_state("p/v1", {"a": torch.ones(1)})
    store.write_state("p/v10", {"a": torch.ones(1)})  # shares the prefix "p/v1"
    store.delete("p/v1")
    assert not store.exists("p/v1")
    assert store.exists("p/v10")  # a sibling with a longer name survives
    assert store.list("p") == ["v10"]
    store.delete("p/v1")  # twice: fine
    with pytest.raises(StoreNotFoundError):
        store.read_state("p/v1")


def test_write_refuses_to_wipe_other_nodes(store: WeightStore) -> None:
    store.write_state("runs/r/versions/v1", {"a": torch.ones(1)})
    with pytest.raises(StoreError, match="refusing"):
        store.write_state("runs/r", {"a": torch.ones(1)})
    assert store.exists("runs/r/versions/v1")
    group = store.open_group("datasets/d", mode="w")
    group.create_array("x", data=np.arange(4))
    with pytest.raises(StoreError, match="refusing"):
        store.write_state("datasets/d", {"a": torch.ones(1)})


# ------------------------------------------------------------- corruption


def test_corrupted_chunk_is_detected(store: WeightStore, backend: Backend) -> None:
    state = {"layer1.0.conv1.weight": torch.randn(4, 3, 3, 3), "fc.bias": torch.randn(10)}
    uri = store.write_state("v", state)
    key, at = chunk_key(store, "v", "layer1.0.conv1.weight")
    raw = bytearray(backend.read_raw(key))
    raw[at + 17] ^= 0xFF
    backend.write_raw(key, bytes(raw))
    with pytest.raises(IntegrityError) as info:
        store.read_state("v")
    assert uri in str(info.value) and "layer1.0.conv1.weight" in str(info.value)
    # verify=False trusts the bytes: same size, so it reads (wrong) values.
    got = store.read_state("v", verify=False)
    assert not torch.equal(got["layer1.0.conv1.weight"], state["layer1.0.conv1.weight"])
    assert torch.equal(got["fc.bias"], state["fc.bias"])


def test_truncated_or_missing_chunk_is_detected(store: WeightStore, backend: Backend) -> None:
    state = {"a": torch.randn(8), "b": torch.randn(2, 2, dtype=torch.float64)}
    store.write_state("v", state)
    key, _ = chunk_key(store, "v", "a")
    good = backend.read_raw(key)
    backend.write_raw(key, good[:-4])
    for verify in (True, False):
        with pytest.raises(IntegrityError, match=r"'a'.*bytes"):
            store.read_state("v", verify=verify)
    backend.write_raw(key, good + b"\0")  # too long is as wrong as too short
    with pytest.raises(IntegrityError, match=r"'a'.*bytes"):
        store.read_state("v")
    backend.write_raw(key, good)
    backend.delete_raw(chunk_key(store, "v", "b")[0])
    with pytest.raises(IntegrityError, match=r"'b'.*missing"):
        store.read_state("v", verify=False)


# ------------------------------------------------------ packing and chunks


def test_tensors_spanning_chunks(
    store: WeightStore, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_layout, "CHUNK_BYTES", 64)  # 16 float32 per chunk
    state = {
        "small": torch.arange(3.0),
        "long": torch.randn(50),  # 200 bytes: spans four chunks
        "n": torch.tensor(7),
        "tail": torch.randn(2, 3),
    }
    store.write_state("v", state)
    assert_same_state(store.read_state("v"), state)
    arr = store.open_group("v")["float32"]
    assert isinstance(arr, zarr.Array)
    assert arr.shape == (59,) and arr.nchunks == 4  # 4 chunks of 15, one element of padding
    # A byte of "long" in its third chunk: the report names "long", not its neighbours.
    prefix, index = chunk_key(store, "v", "long")[0].rsplit(".", 1)
    third = f"{prefix}.{int(index) + 2}"
    raw = bytearray(backend.read_raw(third))
    raw[5] ^= 0x01
    backend.write_raw(third, bytes(raw))
    with pytest.raises(IntegrityError, match="'long'") as info:
        store.read_state("v")
    assert "'small'" not in str(info.value)


def test_a_verified_read_in_pieces_smaller_than_a_chunk(
    store: WeightStore, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local disk's verified read reads and hashes each tensor a piece at a
    # time (store_files.PIECE_BYTES): pieces that do not divide the chunks,
    # tensors that begin mid-chunk and span several, two dtypes.
    monkeypatch.setattr(store_layout, "CHUNK_BYTES", 64)  # 16 float32 per chunk
    monkeypatch.setattr(store_files, "PIECE_BYTES", 24)
    state = {
        "small": torch.arange(3.0),
        "long": torch.randn(50),  # from byte 12 of the first chunk, across four
        "n": torch.tensor(7),
        "d": torch.randn(11, dtype=torch.float64),
    }
    store.write_state("v", state)
    assert_same_state(store.read_state("v"), state)
    assert_same_state(store.reader("v").read(["d", "long"]), {k: state[k] for k in ("d", "long")})
    # A byte inside a piece of "long" in its second chunk: named, nothing else.
    prefix, index = chunk_key(store, "v", "long")[0].rsplit(".", 1)
    second = f"{prefix}.{int(index) + 1}"
    raw = bytearray(backend.read_raw(second))
    raw[29] ^= 0x10
    backend.write_raw(second, bytes(raw))
    with pytest.raises(IntegrityError, match="checksum mismatch in tensor 'long'"):
        store.read_state("v")
    assert_same_state(store.reader("v").read(["d", "small"]), {k: state[k] for k in ("d", "small")})


def test_padding_of_the_last_chunk_is_checked(
    store: WeightStore, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_layout, "CHUNK_BYTES", 64)
    state = {"w": torch.randn(17)}  # 2 chunks of 9 elements: 4 bytes of padding
    store.write_state("v", state)
    key = "v/float32/c.1"
    raw = bytearray(backend.read_raw(key))
    assert len(raw) == 36 and raw[-4:] == bytes(4)
    raw[-1] = 1
    backend.write_raw(key, bytes(raw))
    with pytest.raises(IntegrityError, match="padding"):
        store.read_state("v")
    assert_same_state(store.read_state("v", verify=False), state)  # the data is intact


def test_many_tiny_tensors_in_one_chunk(store: WeightStore) -> None:
    # More pieces in one chunk than one writev/preadv call takes (IOV_MAX 1024).
    state = {f"s{i}": torch.tensor(float(i)) for i in range(2500)}
    state["big"] = torch.randn(1000)
    store.write_state("v", state)
    assert_same_state(store.read_state("v"), state)


def test_a_resnet_state_is_few_files(tmp_path: Path) -> None:
    store = WeightStore(str(tmp_path / "s"))
    state = resnet_like(width=64)
    store.write_state("v", state)
    files = [f for _, _, names in os.walk(tmp_path / "s" / "v") for f in names]
    size = sum(t.nbytes for t in state.values())
    chunks = -(-size // store_layout.CHUNK_BYTES)
    assert len(files) <= 1 + 2 * 2 + chunks + 1  # group doc, 2 arrays, their chunks
    assert len(files) < len(state) / 4


def test_checksums_do_not_depend_on_the_packing(
    store: WeightStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = resnet_like()
    store.write_state("a", state)
    monkeypatch.setattr(store_layout, "CHUNK_BYTES", 256)
    store.write_state("b", state)
    assert store.checksum("a") == store.checksum("b")
    assert vcdl_attrs(store, "a")["tensors"] == vcdl_attrs(store, "b")["tensors"]


# ------------------------------------------------------ older formats


def write_format_1(store: WeightStore, path: str, state: StateDict) -> None:
    """A format 1 group (one single-chunk array per tensor), built with plain zarr."""
    import hashlib

    group = store.open_group(path, mode="w")
    tensors = {}
    for i, (name, t) in enumerate(state.items()):
        bits = store_layout.bits_dtype(t.dtype)
        data = (t.view(bits) if bits is not None else t).contiguous().numpy()
        node = f"-{i}"
        arr = group.create_array(
            node,
            shape=data.shape,
            chunks=tuple(max(1, s) for s in data.shape),
            dtype=data.dtype,
            compressors=None,
            filters=None,
        )
        if data.size:
            arr[...] = data
        tensors[name] = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "checksum": hashlib.sha256(data.tobytes()).hexdigest(),
            "array": node,
        }
    group.attrs["vcdl"] = {
        "format": 1,
        "complete": True,
        "checksum_algorithm": "sha256",
        "tensors": tensors,
        "attrs": {"old": True},
    }
    with warnings.catch_warnings():  # "consolidated metadata is not in the v3 spec"
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(group.store, path=group.path)


def test_format_1_groups_stay_readable(store: WeightStore, backend: Backend) -> None:
    state = {
        "w": torch.randn(3, 4),
        "s": torch.tensor(2.5, dtype=torch.bfloat16),
        "e": torch.zeros(0, 2),
        "n": torch.tensor(5),
    }
    write_format_1(store, "old", state)
    assert vcdl_attrs(store, "old")["format"] == 1
    assert store.exists("old")
    assert_same_state(store.read_state("old"), state)
    assert store.read_attrs("old") == {"old": True}
    store.write_state("new", state)  # the same content in format 2: the same identity
    assert store.checksum("old") == store.checksum("new")
    key = "old/-0/" + store.open_group("old")["-0"].metadata.encode_chunk_key((0, 0))
    raw = bytearray(backend.read_raw(key))
    raw[3] ^= 0xFF
    backend.write_raw(key, bytes(raw))
    with pytest.raises(IntegrityError, match="'w'"):
        store.read_state("old")


def test_unknown_format_is_refused_clearly(store: WeightStore, backend: Backend) -> None:
    store.write_state("v", {"a": torch.ones(2)})
    doc = json.loads(backend.read_raw("v/zarr.json"))
    doc["attributes"]["vcdl"]["format"] = 99
    backend.write_raw("v/zarr.json", json.dumps(doc).encode())
    with pytest.raises(StoreError, match=r"format 99.*reads formats 1, 2.*upgrade vcdl"):
        store.read_state("v")


# ------------------------------------------------- listing, paths, errors


def test_list(store: WeightStore) -> None:
    assert store.list("runs") == []
    assert store.list("") == []
    for name in ("v2", "v10", "v1"):
        store.write_state(f"runs/r/versions/{name}", {"a": torch.ones(1)})
    store.write_state("runs/r/results/e0s0a0", {"a": torch.ones(1)})
    assert store.list("runs/r/versions") == ["v1", "v10", "v2"]
    assert store.list("runs/r/versions/") == ["v1", "v10", "v2"]
    assert store.list("runs/r") == ["results", "versions"]
    assert store.list("runs") == ["r"]
    assert store.list("") == ["runs"]
    assert store.list("runs/nope") == []


def test_other_store_instances_see_new_groups(backend: Backend) -> None:
    reader, writer = backend.store(), backend.store()
    assert reader.list("v") == []
    writer.write_state("v/1", {"a": torch.ones(1)})
    assert reader.list("v") == ["1"]  # no stale listing cache
    assert reader.exists("v/1")
    writer.delete("v/1")
    assert reader.list("v") == []


def test_missing_group_is_not_found(store: WeightStore) -> None:
    assert not store.exists("runs/r/versions/v9")
    for read in (store.read_state, store.read_attrs, store.checksum):
        with pytest.raises(StoreNotFoundError) as info:
            read("runs/r/versions/v9")
        assert store.uri("runs/r/versions/v9") in str(info.value)
    with pytest.raises(StoreNotFoundError):
        store.open_group("datasets/nope")


def test_plain_group_is_not_a_state(store: WeightStore) -> None:
    store.open_group("datasets/d", mode="w").create_array("x", data=np.arange(3))
    assert not store.exists("datasets/d")
    with pytest.raises(StoreNotFoundError, match="not a state group"):
        store.read_state("datasets/d")


@pytest.mark.parametrize(
    "path", ["..", "../x", "a/../b", "a/./b", "/abs/path", "a//b", "__x/y", "s3://b/x", "C:\\x"]
)
def test_bad_paths_are_refused(store: WeightStore, path: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.write_state(path, {"a": torch.ones(1)}),
        lambda: store.read_state(path),
        lambda: store.exists(path),
        lambda: store.delete(path),
        lambda: store.list(path),
        lambda: store.open_group(path),
        lambda: store.uri(path),
    ]
    for call in calls:
        with pytest.raises(StoreError) as info:
            call()
        assert not isinstance(info.value, StoreNotFoundError)


def test_root_is_not_a_group_path(store: WeightStore) -> None:
    for call in (
        lambda: store.write_state("", {"a": torch.ones(1)}),
        lambda: store.delete(""),
        lambda: store.read_state(""),
    ):
        with pytest.raises(StoreError, match="root"):
            call()
    assert store.uri("") == store.url


def test_full_uris_of_this_store_are_accepted(store: WeightStore) -> None:
    uri = store.write_state("runs/r/v1", {"a": torch.ones(2)})
    assert uri == f"{store.url}/runs/r/v1"
    assert store.exists(uri)
    assert torch.equal(store.read_state(uri)["a"], torch.ones(2))
    assert store.list(store.uri("runs/r")) == ["v1"]
    store.delete(uri)
    assert not store.exists("runs/r/v1")


def test_open_group_for_data_sets(store: WeightStore) -> None:
    group = store.open_group("datasets/digits", mode="w")
    group.create_array("x_train", data=np.arange(12, dtype=np.float32).reshape(3, 4))
    group.attrs["complete"] = True
    again = store.open_group("datasets/digits")
    x = again["x_train"]
    assert isinstance(x, zarr.Array)
    np.testing.assert_array_equal(x[...], np.arange(12).reshape(3, 4))
    assert again.attrs["complete"] is True
    assert store.list("datasets") == ["digits"]
    with pytest.raises(ValueError, match="read-only"):  # mode "r" is a read-only store
        x[0, 0] = 5.0


def test_open_store_alias(backend: Backend) -> None:
    a = open_store(backend.url, backend.options)
    assert isinstance(a, WeightStore)
    assert a.url == backend.store().url


# ------------------------------------------------------- backend specific


def test_local_urls_are_normalized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rel = WeightStore("stores/a/")
    assert rel.url == str(tmp_path / "stores" / "a")
    assert WeightStore(f"file://{tmp_path}/stores/a").url == rel.url
    assert rel.uri("v/1") == f"{rel.url}/v/1"
    # Construction and reads do not create the directory; the first write does.
    assert not rel.exists("v/1") and rel.list("") == []
    with pytest.raises(StoreNotFoundError):
        rel.read_state("v/1")
    assert not (tmp_path / "stores").exists()
    rel.write_state("v/1", {"a": torch.ones(1)})
    assert (tmp_path / "stores" / "a" / "v" / "1" / "zarr.json").is_file()


def test_local_root_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("not a directory")
    store = WeightStore(str(tmp_path / "f"))
    with pytest.raises(StoreError, match="writing") as info:
        store.write_state("v", {"a": torch.ones(1)})
    assert "check store.url" in str(info.value)


@pytest.mark.s3
def test_s3_missing_bucket_is_a_clear_error(s3_endpoint: str) -> None:
    store = WeightStore("s3://no-such-bucket/prefix", s3_storage_options(s3_endpoint))
    calls: list[Callable[[], object]] = [
        lambda: store.write_state("v", {"a": torch.ones(1)}),
        lambda: store.read_state("v"),
        lambda: store.exists("v"),
        lambda: store.list("runs"),
    ]
    for call in calls:
        with pytest.raises(StoreError) as info:
            call()
        message = str(info.value)
        assert not isinstance(info.value, StoreNotFoundError)
        assert "bucket 'no-such-bucket' does not exist" in message
        assert s3_endpoint in message and "store.url" in message


@pytest.mark.s3
def test_s3_bucket_root_and_url(s3_endpoint: str) -> None:
    bucket = make_bucket(s3_endpoint)
    store = WeightStore(f"s3://{bucket}/", s3_storage_options(s3_endpoint))
    assert store.url == f"s3://{bucket}"
    store.write_state("v/1", {"a": torch.arange(3)})
    assert store.uri("v/1") == f"s3://{bucket}/v/1"
    assert store.list("") == ["v"]
    assert torch.equal(store.read_state(f"s3://{bucket}/v/1")["a"], torch.arange(3))


def test_unknown_protocol_is_a_store_error() -> None:
    with pytest.raises(StoreError, match=r"store\.url"):
        WeightStore("nosuchproto://bucket/x")


# -------------------------------------------------------------- properties

_HYP_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.int8,
    torch.bool,
]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(_HYP_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == torch.bool:
        flags = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return torch.tensor(flags, dtype=torch.bool).reshape(shape)
    size = n * dtype.itemsize
    # Arbitrary bit patterns: every NaN payload, subnormal and -0.0 included.
    raw = draw(st.binary(min_size=size, max_size=size))
    return (
        torch.frombuffer(bytearray(raw) or bytearray(1), dtype=torch.uint8)[:size]
        .view(dtype)
        .reshape(shape)
    )


@settings(max_examples=30, deadline=None)
@given(state=st.dictionaries(st.text(min_size=1, max_size=12), tensors(), max_size=5))
def test_random_states_round_trip_locally(
    tmp_path_factory: pytest.TempPathFactory, state: StateDict
) -> None:
    store = WeightStore(str(tmp_path_factory.mktemp("hyp")))
    store.write_state("g", state, attrs={"names": list(state)})
    assert_same_state(store.read_state("g"), state)
    assert store.read_attrs("g") == json.loads(json.dumps({"names": list(state)}))


def test_local_permission_denied_is_a_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root here, where chmod cannot deny; fail the write itself.
    def denied(*args: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(store_files, "write_chunk", denied)
    with pytest.raises(StoreError, match="permission denied writing") as info:
        WeightStore(str(tmp_path / "s")).write_state("v", {"a": torch.ones(1)})
    assert "check the credentials" in str(info.value)

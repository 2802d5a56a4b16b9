"""Data sets as Zarr arrays: named arrays per split, any numeric dtype; open, read rows.

This module owns the on-store layout of a data set (format 2), its
description (:class:`DatasetInfo`), opening and listing data sets, and reading
their rows; writing one is :mod:`vcdl.data.dataset_write`'s. Group
``datasets/<name>`` in the :class:`~vcdl.store.WeightStore` holds one Zarr
array per split and field, ``<split>/<field>`` (``train/x``, ``test/y``,
``train/tokens``...), each with the rows along its first axis and its own
dtype, kept as written: token ids stay integers, uint8 images stay uint8
until a batch is formed (:mod:`vcdl.objectives`). Every array of a split is
chunked along rows with the same number of rows per chunk (about
``CHUNK_BYTES`` of all of a row's arrays together), so a block of rows is one
chunk of each. The group's attributes describe it: ``splits`` (per split:
``rows``, ``rows_per_chunk``, ``arrays``: field -> dtype and per-row shape),
``hints`` (what a model factory may need: ``num_classes``, ``vocab_size``,
``context_length``), ``name``, ``source``, ``created_at``, ``fingerprint``
and, written last, ``complete``.

Classification keeps its convention: fields ``x`` (samples) and ``y``
(integer labels in ``[0, num_classes)``), written by
:func:`~vcdl.data.dataset_write.write_dataset`.
Data sets written by vcdl before named arrays (format 1: arrays
``x_train``, ``y_train``, ``x_test``, ``y_test`` at the top) are read as
fields ``x`` and ``y``.

Zarr has no atomic rename, so a data set becomes visible by its ``complete``
attribute, written after the arrays; readers treat a group without it as
missing. A crash mid-write therefore leaves an invisible group, never a
half-readable one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import zarr

from vcdl.data.cache import split_cache
from vcdl.data.stream import ByteCounter, ShardStream, counted
from vcdl.errors import DataError

DATASETS_PREFIX = "datasets"
"""Data sets live in the store under ``datasets/<name>``."""

SPLITS = ("train", "test")
"""The splits every data set has: training rows, and held-out rows for evaluation."""

FORMAT = 2

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")

CHUNK_BYTES = 2 * 1024 * 1024
"""Target uncompressed bytes of one chunk: ~1-4 MiB amortises per-object latency on S3."""


class DatasetStore(Protocol):
    """The part of :class:`vcdl.store.WeightStore` this module and the writer use."""

    def open_group(self, path: str, mode: str = "r") -> zarr.Group: ...

    def list(self, prefix: str) -> list[str]: ...

    def uri(self, path: str) -> str: ...

    def shown(self, path: str = "") -> str: ...

    def delete(self, path: str) -> None: ...


@dataclass(frozen=True)
class ArrayInfo:
    """One field of a split: its dtype (numpy's name) and the shape of one row."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class SplitInfo:
    """One split: its rows, how many rows a chunk holds, and its fields."""

    rows: int
    rows_per_chunk: int
    arrays: Mapping[str, ArrayInfo]

    @property
    def row_bytes(self) -> int:
        return sum(a.row_bytes for a in self.arrays.values())

    @property
    def nbytes(self) -> int:
        """Decoded bytes of the whole split."""
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class DatasetInfo:
    """What a run needs to know about a data set without reading its rows."""

    name: str
    fingerprint: str
    source: str
    splits: Mapping[str, SplitInfo]
    hints: Mapping[str, Any] = field(default_factory=dict)
    format: int = FORMAT
    stats: Mapping[str, float] = field(default_factory=dict)
    """Figures measured on the rows when they were written, for people to compare
    a run against (text: ``unigram_entropy``, nats per token of the whole text)."""

    @property
    def n_train(self) -> int:
        return self.splits["train"].rows

    @property
    def n_test(self) -> int:
        return self.splits["test"].rows

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.splits["train"].arrays)

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        """The shape of one ``x`` row (the classification convention), if there is an ``x``."""
        x = self.splits["train"].arrays.get("x")
        return x.shape if x is not None else None

    @property
    def num_classes(self) -> int | None:
        value = self.hints.get("num_classes")
        return int(value) if value is not None else None

    def factory_hints(self, x: str = "x") -> dict[str, Any]:
        """What a model factory may take from the data set, by keyword (see vcdl.models).

        ``x``: the field the model's input is read from (``[data] fields``' ``x``).
        """
        hints = {k: v for k, v in self.hints.items() if v is not None}
        row = self.splits["train"].arrays.get(x)
        if row is not None:
            hints["input_shape"] = row.shape
        return hints


# --------------------------------------------------------------------------
# Names and paths
# --------------------------------------------------------------------------


def check_name(name: str) -> None:
    """Raise :class:`DataError` unless ``name`` can name a data set in the store."""
    # Names become store path components: no separators, no "." / "..".
    # "__" prefixes are reserved by Zarr for its own keys.
    if (
        not isinstance(name, str)
        or not _NAME_RE.fullmatch(name)
        or set(name) == {"."}
        or name.startswith("__")
    ):
        raise DataError(
            f"invalid data set name {name!r}: use letters, digits, '_', '.' and '-' only "
            "(not only dots, not starting with '__')"
        )


def group_path(name: str) -> str:
    """Where data set ``name`` lives in the store: ``datasets/<name>``."""
    return f"{DATASETS_PREFIX}/{name}"


# --------------------------------------------------------------------------
# Opening
# --------------------------------------------------------------------------


def _not_found(store: DatasetStore, name: str) -> DataError:
    return DataError(
        f"data set '{name}' not found in store {store.shown()}; create it with "
        f"`vcdl data make digits|mnist1d|pytext` or `vcdl data import FILE --name {name}`"
    )


def _open_complete(store: DatasetStore, name: str) -> zarr.Group:
    check_name(name)
    try:
        group = store.open_group(group_path(name), mode="r")
    except (FileNotFoundError, KeyError, zarr.errors.BaseZarrError) as exc:
        raise _not_found(store, name) from exc
    if group.attrs.get("complete") is not True:
        raise _not_found(store, name)
    return group


def _array_key(info: DatasetInfo, split: str, name: str) -> str:
    return f"{split}/{name}" if info.format >= 2 else f"{name}_{split}"


def _array(group: zarr.Group, info: DatasetInfo, split: str, name: str) -> zarr.Array:
    key = _array_key(info, split, name)
    try:
        node = group[key]
    except KeyError:
        node = None
    if not isinstance(node, zarr.Array):
        raise DataError(f"data set '{info.name}' is malformed: array {key!r} is missing")
    return node


def _info_v1(group: zarr.Group, name: str, attrs: Mapping[str, Any]) -> DatasetInfo:
    """A data set written before named arrays: x_train, y_train, x_test, y_test."""
    splits = {}
    for split in SPLITS:
        x, y = group[f"x_{split}"], group[f"y_{split}"]
        assert isinstance(x, zarr.Array) and isinstance(y, zarr.Array)
        arrays = {
            "x": ArrayInfo(np.dtype(x.dtype).name, tuple(int(d) for d in x.shape[1:])),
            "y": ArrayInfo(np.dtype(y.dtype).name, ()),
        }
        splits[split] = SplitInfo(int(attrs[f"n_{split}"]), int(x.chunks[0]), arrays)
    return DatasetInfo(
        name=name,
        fingerprint=str(attrs["fingerprint"]),
        source=str(attrs["source"]),
        splits=splits,
        hints={"num_classes": int(attrs["num_classes"])},
        format=1,
    )


def _info_from_group(group: zarr.Group, name: str, *, check: bool = True) -> DatasetInfo:
    """The data set's description from its attributes; ``check`` compares it with the arrays."""
    attrs: dict[str, Any] = dict(group.attrs)
    try:
        if "splits" not in attrs:
            info = _info_v1(group, name, attrs)
        else:
            splits = {
                s: SplitInfo(
                    int(d["rows"]),
                    int(d["rows_per_chunk"]),
                    {
                        f: ArrayInfo(str(a["dtype"]), tuple(int(n) for n in a["shape"]))
                        for f, a in d["arrays"].items()
                    },
                )
                for s, d in attrs["splits"].items()
            }
            info = DatasetInfo(
                name=name,
                fingerprint=str(attrs["fingerprint"]),
                source=str(attrs["source"]),
                splits=splits,
                hints=dict(attrs.get("hints") or {}),
                format=int(attrs.get("format", FORMAT)),
                stats={str(k): float(v) for k, v in (attrs.get("stats") or {}).items()},
            )
        if any(s not in info.splits for s in SPLITS):
            raise KeyError("splits")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"data set '{name}' is malformed: bad or missing attribute {exc}") from exc
    if not check:
        return info
    # Cheap metadata reads; catches a group edited by hand or by another tool.
    for split, s in info.splits.items():
        for f, a in s.arrays.items():
            arr = _array(group, info, split, f)
            if arr.shape != (s.rows, *a.shape) or np.dtype(arr.dtype) != np.dtype(a.dtype):
                raise DataError(
                    f"data set '{name}' is malformed: {f}_{split} is {arr.dtype} {arr.shape}, "
                    f"its record says {a.dtype} {(s.rows, *a.shape)}"
                )
    return info


def open_dataset(store: DatasetStore, name: str) -> DatasetInfo:
    """Describe the complete data set ``name``; :class:`DataError` if missing or incomplete."""
    return _info_from_group(_open_complete(store, name), name)


def list_datasets(store: DatasetStore) -> list[DatasetInfo]:
    """Every complete data set in the store, sorted by name; incomplete ones are skipped."""
    names: set[str] = set()
    for entry in store.list(DATASETS_PREFIX):
        # Accept either child names or full paths from the store.
        rel = entry.strip("/")
        if rel == DATASETS_PREFIX:
            continue
        if rel.startswith(DATASETS_PREFIX + "/"):
            rel = rel[len(DATASETS_PREFIX) + 1 :]
        head = rel.split("/", 1)[0]
        if head:
            names.add(head)
    infos = []
    for name in sorted(names):
        try:
            infos.append(open_dataset(store, name))
        except DataError:
            continue  # incomplete (being written or crashed), malformed or a foreign name
    return infos


# --------------------------------------------------------------------------
# Reading rows
# --------------------------------------------------------------------------


def read_arrays(
    store: DatasetStore,
    name: str,
    split: str,
    indices: np.ndarray | None = None,
    *,
    fields: Sequence[str] | None = None,
    cache_bytes: int = 0,
    counter: ByteCounter | None = None,
) -> dict[str, np.ndarray]:
    """Rows of one split, by field, each in its stored dtype.

    ``indices`` None reads the whole split; otherwise exactly those rows, in
    the order given (repeats allowed). ``fields`` limits the arrays read.
    Only the chunks holding the rows are read, unless the split is at most
    ``cache_bytes`` decoded: it is then decoded once per process, kept
    (:data:`vcdl.data.cache.split_cache`) and indexed in memory. ``counter``
    adds up the bytes fetched from the store (none on a cache hit).
    """
    info, arrays = _split_arrays(store, name, split, fields, counter)
    n = info.splits[split].rows
    if indices is None:
        return {f: np.asarray(a[...]) for f, a in arrays.items()}
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise DataError(f"indices must be 1-D, got shape {idx.shape}")
    if idx.size == 0:
        return {f: np.empty((0, *a.shape[1:]), dtype=a.dtype) for f, a in arrays.items()}
    if not np.issubdtype(idx.dtype, np.integer):
        raise DataError(f"indices must be integers, got dtype {idx.dtype}")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= n:
        raise DataError(
            f"indices out of range for the {split} split of '{name}' ({n} rows): "
            f"found values from {lo} to {hi}"
        )
    if cache_bytes > 0:
        key = (store.uri(group_path(name)), split, info.fingerprint, tuple(arrays))
        cached = split_cache.arrays(key, arrays, cache_bytes)
        if cached is not None:
            return {f: a[idx] for f, a in cached.items()}  # fancy indexing: fresh copies
    # Zarr's orthogonal selection wants sorted unique indices; map back after.
    uniq, inverse = np.unique(idx, return_inverse=True)
    return {f: np.asarray(a.oindex[uniq])[inverse] for f, a in arrays.items()}


def _split_arrays(
    store: DatasetStore,
    name: str,
    split: str,
    fields: Sequence[str] | None,
    counter: ByteCounter | None,
) -> tuple[DatasetInfo, dict[str, zarr.Array]]:
    """The data set's description and the split's arrays (``fields``, default all)."""
    group = _open_complete(store, name)
    # Each array read checks its own shape; the hot path reads no others.
    info = _info_from_group(group, name, check=False)
    if split not in info.splits:
        raise DataError(f"split must be one of {sorted(info.splits)}, got {split!r}")
    described = info.splits[split]
    wanted = list(described.arrays) if fields is None else list(fields)
    unknown = [f for f in wanted if f not in described.arrays]
    if unknown:
        raise DataError(
            f"data set '{name}' has no field(s) {unknown} (fields: {', '.join(described.arrays)})"
        )
    arrays = {f: _array(group, info, split, f) for f in wanted}
    if counter is not None:
        arrays = {f: counted(a, counter) for f, a in arrays.items()}
    return info, arrays


def stream_rows(
    store: DatasetStore,
    name: str,
    split: str,
    indices: np.ndarray,
    *,
    fields: Sequence[str] | None = None,
    ahead: int = 2,
) -> ShardStream:
    """Rows of one split as a :class:`~vcdl.data.stream.ShardStream`: nothing read yet.

    The rows are read block by block (one stored chunk each) as the stream
    is iterated, ``ahead`` blocks in front; its counter holds the bytes
    fetched. Each chunk the rows touch is read once per pass: with the
    chunk-aligned shard plan a shard touches about its share of the chunks.
    """
    counter = ByteCounter()
    info, arrays = _split_arrays(store, name, split, fields, counter)
    idx = np.asarray(indices)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise DataError(f"indices must be 1-D integers, got {idx.dtype} of shape {idx.shape}")
    n = info.splits[split].rows
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise DataError(f"indices out of range for the {split} split of '{name}' ({n} rows)")
    return ShardStream(arrays, idx, info.splits[split].rows_per_chunk, counter=counter, ahead=ahead)


def read_rows(
    store: DatasetStore,
    name: str,
    split: str,
    indices: np.ndarray | None = None,
    cache_bytes: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a classification data set's split as ``(x, y)`` (:func:`read_arrays`)."""
    got = read_arrays(store, name, split, indices, fields=("x", "y"), cache_bytes=cache_bytes)
    return got["x"], got["y"]

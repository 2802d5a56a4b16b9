"""Data sets as Zarr arrays, importers, built-in small real sets, shard plans.

This module owns everything about training data:

- the on-store layout of a data set: group ``datasets/<name>`` in the
  :class:`~vcdl.store.WeightStore`, arrays ``x_train``, ``y_train``, ``x_test``,
  ``y_test`` (x float32, y int64) chunked along rows, and attributes
  ``name``, ``num_classes``, ``input_shape``, ``source``, ``created_at``,
  ``fingerprint``, ``n_train``, ``n_test`` and, written last, ``complete``;
- writing (:func:`write_dataset`), opening (:func:`open_dataset`), listing
  (:func:`list_datasets`) and reading rows (:func:`read_rows`);
- importers (:func:`import_npz`) and built-in small real sets made from
  installed packages, never downloaded (:func:`make_digits`: scikit-learn's
  bundled 8x8 digits; :func:`make_mnist1d`: MNIST-1D, Greydanus & Kobak 2020,
  https://arxiv.org/abs/2011.14439, generated procedurally);
- shard plans (:func:`shard_plan`, :func:`shard_indices`): a pure function of
  (n, shards, seed, epoch), so any worker can recompute its shard's rows from
  the subtask's coordinates without the plan travelling anywhere.
- the per-process cache of decoded training splits (:func:`read_rows` with
  ``cache_bytes``): a shard's rows are a random subset of the split, so they
  lie in every chunk of it, and reading them decodes the whole split again at
  every attempt (MNIST-1D's 5 MB: ~10 ms of CPU on an idle core, ~40 ms of
  wall on the 2 loaded cores of part (a));
  a split that fits the budget is decoded once per process and indexed in
  memory. Keyed by the store location, split and the data set's
  fingerprint, so a data set imported again under the same name is read
  afresh.

Zarr has no atomic rename, so a data set becomes visible by its ``complete``
attribute, written after the arrays; readers treat a group without it as
missing. A crash mid-write therefore leaves an invisible group, never a
half-readable one.
"""

from __future__ import annotations

import atexit
import datetime as dt
import hashlib
import operator
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import zarr

from vcdl.errors import DataError

__all__ = [
    "DATASETS_PREFIX",
    "DatasetInfo",
    "DatasetStore",
    "dataset_fingerprint",
    "import_npz",
    "list_datasets",
    "make_digits",
    "make_mnist1d",
    "open_dataset",
    "read_rows",
    "shard_indices",
    "shard_plan",
    "write_dataset",
]

DATASETS_PREFIX = "datasets"
"""Data sets live in the store under ``datasets/<name>``."""

SPLITS = ("train", "test")

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")

# Target uncompressed chunk size. ~1-4 MiB amortises per-object latency on S3
# while a shard read (a random subset of rows) still skips nothing it needs.
_CHUNK_BYTES = 2 * 1024 * 1024

# Arrays in hashing/writing order; the fingerprint depends on this order.
_ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")


class DatasetStore(Protocol):
    """The part of :class:`vcdl.store.WeightStore` this module uses."""

    def open_group(self, path: str, mode: str = "r") -> zarr.Group: ...

    def list(self, prefix: str) -> list[str]: ...

    def uri(self, path: str) -> str: ...


@dataclass(frozen=True)
class DatasetInfo:
    """What a run needs to know about a data set without reading its rows."""

    name: str
    n_train: int
    n_test: int
    input_shape: tuple[int, ...]
    num_classes: int
    fingerprint: str
    source: str


# --------------------------------------------------------------------------
# Writing, opening, reading
# --------------------------------------------------------------------------


def _check_name(name: str) -> None:
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


def _group_path(name: str) -> str:
    return f"{DATASETS_PREFIX}/{name}"


def dataset_fingerprint(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray
) -> str:
    """Content hash of a data set's four arrays, ``"sha256:<hex>"``.

    Hashes each array's name, dtype, shape and little-endian C-order bytes, in
    a fixed order, so equal data gives an equal fingerprint whatever the
    chunking or compression in the store. Callers pass the arrays as stored
    (x float32, y int64); :func:`write_dataset` does.
    """
    h = hashlib.sha256()
    for key, arr in zip(_ARRAY_KEYS, (x_train, y_train, x_test, y_test), strict=True):
        a = np.ascontiguousarray(arr)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(f"{key}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.data)
    return f"sha256:{h.hexdigest()}"


def _as_x(key: str, x: Any) -> np.ndarray:
    a = np.asarray(x)
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        raise DataError(f"{key} must be numeric, got dtype {a.dtype}")
    if np.iscomplexobj(a):
        raise DataError(f"{key} must be real, got dtype {a.dtype}")
    if a.ndim < 2:
        raise DataError(f"{key} must have shape (rows, *sample_shape), got shape {a.shape}")
    # Convert first, then check: float64 values beyond float32's range become
    # inf here and must be caught too.
    with np.errstate(over="ignore"):
        a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        bad = int(np.count_nonzero(~np.isfinite(a)))
        raise DataError(f"{key} has {bad} non-finite value(s) (NaN/Inf, or beyond float32 range)")
    return a


def _as_y(key: str, y: Any) -> np.ndarray:
    a = np.asarray(y)
    if not np.issubdtype(a.dtype, np.integer):
        raise DataError(
            f"{key} must hold integer class labels, got dtype {a.dtype}; "
            "convert with y.astype(np.int64)"
        )
    if a.ndim != 1:
        raise DataError(f"{key} must be 1-D (one label per row), got shape {a.shape}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _rows_per_chunk(shape: tuple[int, ...], itemsize: int) -> int:
    row_bytes = itemsize * int(np.prod(shape[1:], dtype=np.int64))
    return max(1, min(shape[0], _CHUNK_BYTES // max(1, row_bytes)))


def write_dataset(
    store: DatasetStore,
    name: str,
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    *,
    source: str,
    num_classes: int | None = None,
) -> DatasetInfo:
    """Validate and write a data set to ``datasets/<name>``, replacing any old one.

    x arrays are stored as float32 with shape ``(rows, *input_shape)``, y as
    int64 labels in ``[0, num_classes)``. ``num_classes`` defaults to the
    largest label + 1; pass it when the top class may be absent.
    Raises :class:`DataError` naming the first problem found.
    """
    _check_name(name)
    xtr, xte = _as_x("x_train", x_train), _as_x("x_test", x_test)
    ytr, yte = _as_y("y_train", y_train), _as_y("y_test", y_test)
    for split, x, y in (("train", xtr, ytr), ("test", xte, yte)):
        if len(x) == 0:
            raise DataError(f"the {split} split is empty: need at least 1 row")
        if len(x) != len(y):
            raise DataError(f"x_{split} has {len(x)} rows but y_{split} has {len(y)}")
    if xtr.shape[1:] != xte.shape[1:]:
        raise DataError(
            f"x_train samples have shape {xtr.shape[1:]} but x_test samples {xte.shape[1:]}"
        )
    lo = int(min(ytr.min(), yte.min()))
    hi = int(max(ytr.max(), yte.max()))
    if num_classes is None:
        num_classes = hi + 1
    num_classes = operator.index(num_classes)
    if num_classes < 1:
        raise DataError(f"num_classes must be >= 1, got {num_classes}")
    if lo < 0 or hi >= num_classes:
        raise DataError(
            f"labels must be integers in [0, {num_classes}), found values from {lo} to {hi}"
        )

    info = DatasetInfo(
        name=name,
        n_train=len(xtr),
        n_test=len(xte),
        input_shape=tuple(int(d) for d in xtr.shape[1:]),
        num_classes=num_classes,
        fingerprint=dataset_fingerprint(xtr, ytr, xte, yte),
        source=source,
    )
    group = store.open_group(_group_path(name), mode="w")
    arrays = {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}
    for key, arr in arrays.items():
        # y shares x's row chunking so a row selection touches aligned chunks.
        x_like = arrays["x_" + key.split("_", 1)[1]]
        rows = _rows_per_chunk(x_like.shape, x_like.dtype.itemsize)
        group.create_array(key, data=arr, chunks=(rows, *arr.shape[1:]))
    group.update_attributes(
        {
            "name": name,
            "num_classes": num_classes,
            "input_shape": list(info.input_shape),
            "source": source,
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
            "fingerprint": info.fingerprint,
            "n_train": info.n_train,
            "n_test": info.n_test,
        }
    )
    # Last: until this lands, readers see no data set (zarr has no rename).
    group.update_attributes({"complete": True})
    return info


def _not_found(store: DatasetStore, name: str) -> DataError:
    return DataError(
        f"data set '{name}' not found in store {store.uri('')}; create it with "
        f"`vcdl data make digits|mnist1d` or `vcdl data import FILE.npz --name {name}`"
    )


def _open_complete(store: DatasetStore, name: str) -> zarr.Group:
    _check_name(name)
    try:
        group = store.open_group(_group_path(name), mode="r")
    except (FileNotFoundError, KeyError, zarr.errors.BaseZarrError) as exc:
        raise _not_found(store, name) from exc
    if group.attrs.get("complete") is not True:
        raise _not_found(store, name)
    return group


def _array(group: zarr.Group, key: str, name: str) -> zarr.Array:
    try:
        node = group[key]
    except KeyError:
        node = None
    if not isinstance(node, zarr.Array):
        raise DataError(f"data set '{name}' is malformed: array {key!r} is missing")
    return node


def _info_from_group(group: zarr.Group, name: str) -> DatasetInfo:
    attrs: dict[str, Any] = dict(group.attrs)
    try:
        info = DatasetInfo(
            name=name,
            n_train=int(attrs["n_train"]),
            n_test=int(attrs["n_test"]),
            input_shape=tuple(int(d) for d in attrs["input_shape"]),
            num_classes=int(attrs["num_classes"]),
            fingerprint=str(attrs["fingerprint"]),
            source=str(attrs["source"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"data set '{name}' is malformed: bad or missing attribute {exc}") from exc
    # Cheap metadata reads; catches a group edited by hand or by another tool.
    for split, n in (("train", info.n_train), ("test", info.n_test)):
        x, y = _array(group, f"x_{split}", name), _array(group, f"y_{split}", name)
        if x.shape != (n, *info.input_shape) or y.shape != (n,):
            raise DataError(
                f"data set '{name}' is malformed: x_{split} {x.shape} / y_{split} {y.shape} "
                f"do not match {n} rows of shape {info.input_shape}"
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


class SplitCache:
    """Decoded splits kept in memory, least recently used first out, within a byte budget.

    Thread-safe: a worker's spare Dask thread reads ahead while another
    trains. The budget is the largest any caller asked for; a split larger
    than the caller's budget is never kept.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        self.budget = 0

    @staticmethod
    def nbytes(x: zarr.Array | np.ndarray, y: zarr.Array | np.ndarray) -> int:
        """Decoded size of a split's two arrays, from their shapes (nothing read)."""
        return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in (x, y))

    def arrays(
        self, key: tuple[str, str, str], x: zarr.Array, y: zarr.Array, budget: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The split's decoded arrays (read on the first call), or None if over ``budget``."""
        size = self.nbytes(x, y)
        if size > budget:
            return None
        # Under the lock: two threads asking at once decode the split once.
        with self._lock:
            self.budget = max(self.budget, budget)
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
            xs, ys = np.asarray(x[...]), np.asarray(y[...])
            xs.setflags(write=False)  # shared by every later shard: never written
            ys.setflags(write=False)
            self._items[key] = (xs, ys)
            while sum(self.nbytes(*v) for v in self._items.values()) > self.budget:
                self._items.popitem(last=False)
            return xs, ys


split_cache = SplitCache()
"""This process's cache of decoded splits (:func:`read_rows` with ``cache_bytes``)."""


def read_rows(
    store: DatasetStore,
    name: str,
    split: str,
    indices: np.ndarray | None = None,
    cache_bytes: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one split as ``(x float32, y int64)``.

    ``indices`` None reads the whole split; otherwise exactly those rows, in
    the order given (repeats allowed). Only the chunks holding them are read,
    unless the split is at most ``cache_bytes`` decoded: it is then decoded
    once per process, kept (:data:`split_cache`) and indexed in memory.
    """
    if split not in SPLITS:
        raise DataError(f"split must be one of {SPLITS}, got {split!r}")
    group = _open_complete(store, name)
    x_arr, y_arr = _array(group, f"x_{split}", name), _array(group, f"y_{split}", name)
    n = x_arr.shape[0]
    if indices is None:
        return np.asarray(x_arr[...]), np.asarray(y_arr[...])
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise DataError(f"indices must be 1-D, got shape {idx.shape}")
    if idx.size == 0:
        return (
            np.empty((0, *x_arr.shape[1:]), dtype=np.float32),
            np.empty((0,), dtype=np.int64),
        )
    if not np.issubdtype(idx.dtype, np.integer):
        raise DataError(f"indices must be integers, got dtype {idx.dtype}")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= n:
        raise DataError(
            f"indices out of range for the {split} split of '{name}' ({n} rows): "
            f"found values from {lo} to {hi}"
        )
    if cache_bytes > 0:
        key = (store.uri(_group_path(name)), split, str(group.attrs.get("fingerprint")))
        cached = split_cache.arrays(key, x_arr, y_arr, cache_bytes)
        if cached is not None:
            return cached[0][idx], cached[1][idx]  # fancy indexing: fresh, writable copies
    # Zarr's orthogonal selection wants sorted unique indices; map back after.
    uniq, inverse = np.unique(idx, return_inverse=True)
    x = np.asarray(x_arr.oindex[uniq])
    y = np.asarray(y_arr.oindex[uniq])
    return x[inverse], y[inverse]


# --------------------------------------------------------------------------
# Importers and built-in sets
# --------------------------------------------------------------------------


def import_npz(
    store: DatasetStore, path: str | Path, name: str, *, num_classes: int | None = None
) -> DatasetInfo:
    """Import an ``.npz`` with keys x_train, y_train, x_test, y_test (no pickle, ever)."""
    p = Path(path)
    try:
        npz = np.load(p, allow_pickle=False)
    except FileNotFoundError as exc:
        raise DataError(f"cannot import {p}: file not found") from exc
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"cannot import {p}: not a readable .npz file ({exc})") from exc
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DataError(f"cannot import {p}: it is a single .npy array, not an .npz archive")
    with npz:
        found = sorted(npz.files)
        missing = [k for k in _ARRAY_KEYS if k not in found]
        if missing:
            raise DataError(
                f"cannot import {p}: missing key(s) {', '.join(missing)}; "
                f"found {', '.join(found) or 'none'}; "
                f"need {', '.join(_ARRAY_KEYS)}"
            )
        arrays: dict[str, np.ndarray] = {}
        for key in _ARRAY_KEYS:
            try:
                arrays[key] = npz[key]
            except ValueError as exc:
                # Object arrays need pickle, which could run code: refuse.
                raise DataError(
                    f"cannot import {p}: array {key!r} cannot be loaded without pickle "
                    f"({exc}); save plain numeric arrays"
                ) from exc
            except (OSError, EOFError, zipfile.BadZipFile) as exc:
                raise DataError(f"cannot import {p}: array {key!r} is unreadable ({exc})") from exc
    return write_dataset(
        store, name, **arrays, source=f"npz:{p.resolve()}", num_classes=num_classes
    )


def make_digits(
    store: DatasetStore,
    name: str = "digits",
    size: int = 32,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DatasetInfo:
    """scikit-learn's bundled 8x8 digits (1,797 images, no download), as ``(N, 1, size, size)``.

    Pixels are scaled to [0, 1] and upsampled by nearest neighbour (each pixel
    becomes a ``size/8`` square) so image-sized models apply. The split is
    stratified and seeded.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if size < 8 or size % 8:
        raise DataError(f"size must be a positive multiple of 8, got {size}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # values 0..16 -> [0, 1]
    factor = size // 8
    x = np.kron(images, np.ones((1, factor, factor), dtype=np.float32))[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return write_dataset(
        store,
        name,
        x_train,
        y_train,
        x_test,
        y_test,
        source=f"sklearn.datasets.load_digits(size={size}, test_fraction={test_fraction}, "
        f"seed={seed})",
        num_classes=10,
    )


_MPL_TMP: str | None = None


@contextmanager
def _matplotlib_cache_in_tmp() -> Iterator[None]:
    """Keep matplotlib's font cache out of ``~/.cache`` while importing mnist1d.

    ``mnist1d/__init__`` imports ``matplotlib.pyplot`` (for its plotting
    helper), whose first import writes a font list into the user's cache
    directory. Unless the user chose a directory or matplotlib is already
    loaded, point it at a private temp dir, removed at exit.
    """
    global _MPL_TMP
    if "matplotlib" in sys.modules or "MPLCONFIGDIR" in os.environ:
        yield
        return
    if _MPL_TMP is None:
        _MPL_TMP = tempfile.mkdtemp(prefix="vcdl-matplotlib-")
        atexit.register(shutil.rmtree, _MPL_TMP, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = _MPL_TMP
    try:
        yield
    finally:
        # matplotlib caches the directory at import; the env var can go.
        os.environ.pop("MPLCONFIGDIR", None)


def make_mnist1d(
    store: DatasetStore, name: str = "mnist1d", samples: int = 40000, seed: int = 42
) -> DatasetInfo:
    """MNIST-1D generated locally: x ``(N, 40)`` float32, 10 classes, 80/20 split.

    Calls ``mnist1d.data.make_dataset`` directly: unlike ``get_dataset`` it
    neither downloads the reference pickle nor writes a cache file. It seeds
    the global ``random``/``np.random`` state; that state is restored after.
    About 0.2 ms per sample (40,000 in ~8 s on one core).
    """
    if samples < 10:
        raise DataError(f"samples must be >= 10 (one per class), got {samples}")
    with _matplotlib_cache_in_tmp():
        from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = int(samples)
    args.seed = int(seed)
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return write_dataset(
        store,
        name,
        d["x"],
        d["y"],
        d["x_test"],
        d["y_test"],
        source=f"mnist1d.data.make_dataset(num_samples={samples}, seed={seed})",
        num_classes=10,
    )


# --------------------------------------------------------------------------
# Shard plans (pure)
# --------------------------------------------------------------------------


def shard_plan(n: int, shards: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Split a fresh seeded permutation of ``range(n)`` into ``shards`` parts.

    Pure and deterministic in (n, shards, seed, epoch); a different epoch
    gives a different permutation. Every index appears exactly once; part
    sizes differ by at most 1 (the first ``n % shards`` parts are larger).
    """
    n, shards, seed, epoch = (operator.index(v) for v in (n, shards, seed, epoch))
    if shards < 1 or shards > n:
        raise DataError(f"shards must be between 1 and n={n}, got {shards}")
    if seed < 0 or epoch < 0:
        raise DataError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    # (seed, epoch) as SeedSequence entropy: independent streams per epoch.
    perm = np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)
    return list(np.array_split(perm, shards))


def shard_indices(n: int, shards: int, seed: int, epoch: int, shard: int) -> np.ndarray:
    """The rows of one shard: ``shard_plan(n, shards, seed, epoch)[shard]``."""
    shard = operator.index(shard)
    plan = shard_plan(n, shards, seed, epoch)
    if not 0 <= shard < len(plan):
        raise DataError(f"shard must be in [0, {len(plan)}), got {shard}")
    return plan[shard]

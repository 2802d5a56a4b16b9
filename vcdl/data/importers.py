"""Importers: data sets from files the user brings. No pickle, ever.

* :func:`import_npz`: an ``.npz`` archive of arrays with any names. Names
  ending in ``_train`` / ``_test`` give the splits (``x_train``, ``tokens_test``
  ...); an archive without such suffixes is one table, split by
  ``test_fraction``. ``x``/``y`` with integer ``y`` is the classification
  convention (labels checked).
* :func:`import_text`: a text file, or a folder of them, as byte-level
  token sequences (vocabulary 256) of ``context`` tokens plus the next one,
  the last ``test_fraction`` of the text held out.
* :func:`import_table`: a Parquet file or an Arrow IPC file (``.arrow``,
  ``.feather``): numeric and fixed-size-list columns become fields; a
  column named ``split`` (values ``train`` / ``test``) gives the splits, else
  ``test_fraction`` of the rows are held out.

Every importer reads and checks everything first and writes only then: bad
input is one :class:`~vcdl.errors.DataError` line (the CLI's exit 2) and
nothing in the store. A file whose headers claim more memory than this
machine has is refused before anything is allocated.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vcdl.data.datasets import SPLITS, DatasetInfo, DatasetStore, write_arrays, write_dataset
from vcdl.errors import DataError

TEXT_VOCAB = 256
"""Byte-level tokens: every byte value is a token."""

_SPLIT_SUFFIX = re.compile(r"^(?P<field>.+)_(?P<split>train|test)$")


def memory_bytes() -> int:
    """This machine's physical memory (bytes); a large number where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _refuse_oversized(what: str, nbytes: int) -> None:
    limit = memory_bytes()
    if nbytes > limit:
        raise DataError(
            f"cannot import {what}: it claims {nbytes / 2**30:.1f} GiB, more than this "
            f"machine's {limit / 2**30:.1f} GiB of memory; import it in parts"
        )


def holdout(rows: int, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of a seeded random split; both non-empty."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n_test = round(rows * test_fraction)
    if rows < 2 or n_test < 1 or n_test >= rows:
        raise DataError(
            f"{rows} row(s) cannot be split into non-empty train and test parts at "
            f"test_fraction {test_fraction}"
        )
    order = np.random.default_rng(seed).permutation(rows)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def _split_table(
    columns: Mapping[str, np.ndarray], test_fraction: float, seed: int
) -> dict[str, dict[str, np.ndarray]]:
    rows = len(next(iter(columns.values())))
    train, test = holdout(rows, test_fraction, seed)
    return {
        "train": {f: a[train] for f, a in columns.items()},
        "test": {f: a[test] for f, a in columns.items()},
    }


def _write(
    store: DatasetStore,
    name: str,
    splits: dict[str, dict[str, np.ndarray]],
    source: str,
    num_classes: int | None,
) -> DatasetInfo:
    """Write as classification (x, integer y: labels checked) or as named arrays."""
    fields = set(splits["train"])
    y = splits["train"].get("y")
    if (
        fields == {"x", "y"}
        and y is not None
        and y.ndim == 1
        and np.issubdtype(y.dtype, np.integer)
    ):
        return write_dataset(
            store,
            name,
            splits["train"]["x"],
            splits["train"]["y"],
            splits["test"]["x"],
            splits["test"]["y"],
            source=source,
            num_classes=num_classes,
        )
    hints = {"num_classes": num_classes} if num_classes is not None else None
    return write_arrays(store, name, splits, source=source, hints=hints)


# --------------------------------------------------------------------------
# .npz
# --------------------------------------------------------------------------


def _npz_sizes(path: Path) -> dict[str, int]:
    """Bytes each array of an .npz claims in its header, read without loading any."""
    sizes = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if not member.endswith(".npy"):
                continue
            with archive.open(member) as f:
                version = np.lib.format.read_magic(f)
                header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = header(f)
            # Python's integers: numpy's int64 product wraps (a claim of 2^64 rows x 2^64
            # would read as 0 bytes and pass).
            sizes[member[:-4]] = math.prod(shape) * dtype.itemsize
    return sizes


def import_npz(
    store: DatasetStore,
    path: str | Path,
    name: str,
    *,
    num_classes: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DatasetInfo:
    """Import an ``.npz`` of named arrays (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"cannot import {p}: file not found")
    with open(p, "rb") as f:
        if f.read(6) == b"\x93NUMPY":
            raise DataError(f"cannot import {p}: it is a single .npy array, not an .npz archive")
    try:
        # The headers first: nothing is allocated for an archive that claims too much.
        _refuse_oversized(str(p), sum(_npz_sizes(p).values()))
        npz = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"cannot import {p}: not a readable .npz file ({exc})") from exc
    assert isinstance(npz, np.lib.npyio.NpzFile)
    with npz:
        keys = sorted(npz.files)
        if not keys:
            raise DataError(f"cannot import {p}: the archive holds no arrays")
        arrays: dict[str, np.ndarray] = {}
        for key in keys:
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
    suffixed = {k: _SPLIT_SUFFIX.match(k) for k in keys}
    if all(suffixed.values()):
        splits: dict[str, dict[str, np.ndarray]] = {}
        for key, m in suffixed.items():
            assert m is not None
            splits.setdefault(m["split"], {})[m["field"]] = arrays[key]
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise DataError(
                f"cannot import {p}: no array for the {', '.join(missing)} split; found "
                f"{', '.join(keys)}; name arrays <field>_train and <field>_test (e.g. "
                "x_train, y_train, x_test, y_test), or give none a suffix to split by "
                "--test-fraction"
            )
    elif not any(suffixed.values()):
        lengths = {k: len(a) if a.ndim else 0 for k, a in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise DataError(
                f"cannot import {p}: the arrays differ in rows "
                f"({', '.join(f'{k} {n}' for k, n in lengths.items())}); one table needs "
                "equal rows"
            )
        splits = _split_table(arrays, test_fraction, seed)
    else:
        plain = [k for k, m in suffixed.items() if m is None]
        raise DataError(
            f"cannot import {p}: some arrays name a split and some do not ({', '.join(plain)}); "
            "name them all <field>_train / <field>_test, or none"
        )
    return _write(store, name, splits, f"npz:{p.resolve()}", num_classes)


# --------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------


def byte_windows(data: bytes, context: int) -> np.ndarray:
    """``data`` as non-overlapping rows of ``context + 1`` byte tokens (uint8); a tail is dropped.

    A row's first ``context`` tokens are a model's input and its last
    ``context`` the targets (causal language modelling).
    """
    width = context + 1
    rows = len(data) // width
    return np.frombuffer(data[: rows * width], dtype=np.uint8).reshape(rows, width).copy()


def unigram_entropy(data: bytes) -> float:
    """The entropy of the text's byte frequencies, in nats per byte.

    The loss of the best model that ignores context: a language model that
    does not end well below it has learnt nothing but letter frequencies.
    """
    if not data:
        return 0.0
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=TEXT_VOCAB)
    p = counts[counts > 0] / len(data)
    return float(-(p * np.log(p)).sum())


def text_splits(
    data: bytes, context: int, test_fraction: float
) -> dict[str, dict[str, np.ndarray]]:
    """The text's token rows: the first part trains, the last ``test_fraction`` is held out.

    Held out as one contiguous tail, not as random rows: rows cut from the
    same passage would leak it into the test split.
    """
    if context < 1:
        raise DataError(f"context must be >= 1 token, got {context}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    cut = int(len(data) * (1.0 - test_fraction))
    train, test = byte_windows(data[:cut], context), byte_windows(data[cut:], context)
    if len(train) == 0 or len(test) == 0:
        raise DataError(
            f"{len(data)} bytes of text make no rows of {context + 1} tokens in both the "
            f"train and the test part (test_fraction {test_fraction}); give more text or a "
            "shorter --context"
        )
    return {"train": {"tokens": train}, "test": {"tokens": test}}


def _text_files(p: Path, pattern: str) -> list[Path]:
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.rglob(pattern) if f.is_file())
        if not files:
            raise DataError(f"cannot import {p}: no file matches {pattern!r} in the folder")
        return files
    raise DataError(f"cannot import {p}: no such file or folder")


def import_text(
    store: DatasetStore,
    path: str | Path,
    name: str,
    *,
    context: int = 128,
    test_fraction: float = 0.1,
    pattern: str = "*.txt",
) -> DatasetInfo:
    """Import a text file, or the files matching ``pattern`` under a folder, as byte tokens.

    The files are joined in path order, separated by a blank line. Rows hold
    ``context + 1`` tokens (field ``tokens``, uint8); hints ``vocab_size``
    256 and ``context_length`` for the model; stats ``unigram_entropy``
    (:func:`unigram_entropy` of the whole text).
    """
    p = Path(path)
    files = _text_files(p, pattern)
    _refuse_oversized(str(p), sum(f.stat().st_size for f in files))
    try:
        data = b"\n\n".join(f.read_bytes() for f in files)
    except OSError as exc:
        raise DataError(f"cannot import {p}: {exc}") from exc
    splits = text_splits(data, context, test_fraction)
    return write_arrays(
        store,
        name,
        splits,
        source=f"text:{p.resolve()} ({len(files)} file(s), {len(data)} bytes)",
        hints={"vocab_size": TEXT_VOCAB, "context_length": context},
        stats={"unigram_entropy": unigram_entropy(data)},
    )


# --------------------------------------------------------------------------
# Parquet and Arrow tables
# --------------------------------------------------------------------------


def _column(name: str, column: Any, where: str) -> np.ndarray:
    """A numeric or fixed-size-list column as an array (rows first)."""
    import pyarrow as pa

    if column.null_count:
        raise DataError(f"cannot import {where}: column {name!r} has {column.null_count} null(s)")
    kind = column.type
    shape: list[int] = []
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise DataError(
            f"cannot import {where}: column {name!r} is {column.type}; only numeric columns "
            "and fixed-size lists of numbers can be imported"
        )
    values = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    for _ in shape:
        values = values.flatten()
    flat = values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat.reshape(len(column), *shape))


def _read_table(p: Path) -> Any:
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    try:
        if p.suffix in (".arrow", ".feather", ".ipc"):
            with pa.memory_map(str(p)) as source:
                try:
                    return pyarrow.ipc.open_file(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    return pyarrow.ipc.open_stream(source).read_all()
        meta = pq.read_metadata(p)
        _refuse_oversized(
            str(p), sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        )
        return pq.read_table(p)
    except DataError:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot import {p}: not a readable Parquet or Arrow file ({exc})") from exc


def import_table(
    store: DatasetStore,
    path: str | Path,
    name: str,
    *,
    num_classes: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DatasetInfo:
    """Import a Parquet or Arrow IPC table (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"cannot import {p}: file not found")
    table = _read_table(p)
    if table.num_rows == 0 or table.num_columns == 0:
        raise DataError(f"cannot import {p}: the table is empty")
    columns = {n: table.column(n) for n in table.column_names}
    split_col = columns.pop("split", None)
    arrays = {n: _column(n, c, str(p)) for n, c in columns.items()}
    if not arrays:
        raise DataError(f"cannot import {p}: no column besides 'split'")
    if split_col is None:
        splits = _split_table(arrays, test_fraction, seed)
    else:
        labels = np.asarray(split_col.to_pylist(), dtype=object)
        unknown = sorted({str(v) for v in labels} - set(SPLITS))
        if unknown:
            raise DataError(
                f"cannot import {p}: column 'split' holds {unknown}; use train and test"
            )
        splits = {s: {n: a[labels == s] for n, a in arrays.items()} for s in SPLITS}
    return _write(store, name, splits, f"table:{p.resolve()}", num_classes)

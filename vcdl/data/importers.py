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
nothing in the store. What a file will decode to is checked from its
metadata before anything is decoded (:mod:`vcdl.data.decoded`: zip sizes and
ratios, every member's ``.npy`` header, Arrow buffer lengths, Parquet row
counts and page headers): past the import's memory ceiling or ratio limit it
is refused with nothing allocated; below them it is read in bounded chunks
into memory of the size checked (a Parquet file batch by batch, refused as
soon as what it decoded passes the ceiling: :mod:`vcdl.data.parquet_read`).
Only regular files are read (a FIFO or a device is refused).
"""

from __future__ import annotations

import lzma
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vcdl.data.dataset_write import write_arrays, write_dataset
from vcdl.data.datasets import SPLITS, DatasetInfo, DatasetStore
from vcdl.data.decoded import (
    CHUNK,
    ipc_decoded_bytes,
    npz_members,
    read_npy_member,
    refuse_over_limit,
    regular_file,
    unreadable_path,
)
from vcdl.data.parquet_read import read_parquet
from vcdl.errors import DataError

TEXT_VOCAB = 256
"""Byte-level tokens: every byte value is a token."""

_SPLIT_SUFFIX = re.compile(r"^(?P<field>.+)_(?P<split>train|test)$")


def _reason(exc: BaseException) -> str:
    """An exception's text on one line, at most 200 characters (a library's may span lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


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


def _read_npz(p: Path) -> dict[str, np.ndarray]:
    """The archive's arrays by key: every header checked first, then each read in chunks."""
    where = str(p)
    try:
        with zipfile.ZipFile(p) as archive:
            # The headers first: nothing is allocated for an archive that claims too much.
            members = npz_members(archive, where)
            if not members:
                raise DataError(f"cannot import {p}: the archive holds no arrays")
            return {m.key: read_npy_member(archive, m, where) for m in members}
    except (
        OSError,
        ValueError,
        EOFError,
        zipfile.BadZipFile,
        NotImplementedError,
        zlib.error,
        lzma.LZMAError,
    ) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"cannot import {p}: not a readable .npz file ({_reason(exc)})") from exc


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
    regular_file(p)
    with open(p, "rb") as f:
        if f.read(6) == b"\x93NUMPY":
            raise DataError(f"cannot import {p}: it is a single .npy array, not an .npz archive")
    arrays = _read_npz(p)
    keys = sorted(arrays)
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
        lengths = {k: len(a) for k, a in arrays.items()}
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
    arrays.clear()  # the splits hold what they need: a copy each where split by fraction
    return _write(store, name, splits, f"npz:{p.resolve()}", num_classes)


# --------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------


def byte_windows(data: bytes | bytearray | memoryview, context: int) -> np.ndarray:
    """``data`` as non-overlapping rows of ``context + 1`` byte tokens (uint8); a tail is dropped.

    A row's first ``context`` tokens are a model's input and its last
    ``context`` the targets (causal language modelling).
    """
    width = context + 1
    rows = len(data) // width
    return np.frombuffer(data[: rows * width], dtype=np.uint8).reshape(rows, width).copy()


def unigram_entropy(data: bytes | bytearray | memoryview) -> float:
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
    data: bytes | bytearray | memoryview, context: int, test_fraction: float
) -> dict[str, dict[str, np.ndarray]]:
    """The text's token rows: the first part trains, the last ``test_fraction`` is held out.

    Held out as one contiguous tail, not as random rows: rows cut from the
    same passage would leak it into the test split.
    """
    if context < 1:
        raise DataError(f"context must be >= 1 token, got {context}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    view = memoryview(data)
    cut = int(len(view) * (1.0 - test_fraction))
    fits = context < min(cut, len(view) - cut)  # before a row's width could overflow
    train, test = (
        (byte_windows(view[:cut], context), byte_windows(view[cut:], context))
        if fits
        else (np.empty((0, 0), np.uint8),) * 2
    )
    if len(train) == 0 or len(test) == 0:
        raise DataError(
            f"{len(view)} bytes of text make no rows of {context + 1} tokens in both the "
            f"train and the test part (test_fraction {test_fraction}); give more text or a "
            "shorter --context"
        )
    return {"train": {"tokens": train}, "test": {"tokens": test}}


def _text_files(p: Path, pattern: str) -> list[Path]:
    try:
        if p.is_file():
            return [p]
        if p.is_dir():
            # Regular files only: a FIFO or a device named *.txt would block or never end.
            files = sorted(f for f in p.rglob(pattern) if f.is_file())
            if not files:
                raise DataError(
                    f"cannot import {p}: no file matches {pattern[:100]!r} in the folder"
                )
            return files
        exists = p.exists()
    except DataError:
        raise
    except OSError as exc:  # a name too long, a folder it may not enter
        raise unreadable_path(p, exc) from None
    except (ValueError, NotImplementedError) as exc:  # a pattern pathlib refuses (absolute)
        raise DataError(
            f"cannot import {p}: --pattern {pattern[:100]!r} cannot be used ({exc}); give a "
            "relative pattern such as *.txt"
        ) from None
    if exists:
        raise DataError(
            f"cannot import {p}: not a regular file or a folder (a FIFO or a device cannot be "
            "imported); give a file or a folder of them"
        )
    raise DataError(f"cannot import {p}: no such file or folder")


def _read_text(files: list[Path]) -> bytearray:
    """The files joined by blank lines, each read in chunks up to the size it had when listed."""
    sizes = [f.stat().st_size for f in files]
    data = bytearray(sum(sizes) + 2 * (len(files) - 1))
    view = memoryview(data)
    pos = 0
    for i, (f, size) in enumerate(zip(files, sizes, strict=True)):
        if i:
            view[pos : pos + 2] = b"\n\n"
            pos += 2
        with open(f, "rb") as fh:
            end = pos + size
            while pos < end:
                got = fh.readinto(view[pos : min(end, pos + CHUNK)])
                if not got:
                    break  # the file shrank since it was listed
                pos += got
    view.release()
    del data[pos:]
    return data


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
    if context < 1:
        raise DataError(f"context must be >= 1 token, got {context}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    files = _text_files(p, pattern)
    try:
        refuse_over_limit(str(p), sum(f.stat().st_size for f in files))
        data = _read_text(files)
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


def _row_shape(name: str, kind: Any, where: str) -> list[int]:
    """The row shape of a numeric or fixed-size-list column's type; refused for any other."""
    import pyarrow as pa

    shape: list[int] = []
    leaf = kind
    while pa.types.is_fixed_size_list(leaf):
        shape.append(leaf.list_size)
        leaf = leaf.value_type
    if not (pa.types.is_integer(leaf) or pa.types.is_floating(leaf) or pa.types.is_boolean(leaf)):
        raise DataError(
            f"cannot import {where}: column {name[:100]!r} is {kind}; only numeric columns "
            "and fixed-size lists of numbers can be imported"
        )
    return shape


def _check_schema(schema: Any, where: str) -> None:
    """Column names and types, from the schema alone: refused before any row is decoded."""
    names = list(schema.names)
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise DataError(
            f"cannot import {where}: column name(s) {', '.join(map(repr, twice))[:200]} appear "
            "more than once; give each column its own name"
        )
    for field in schema:
        if field.name != "split":
            _row_shape(field.name, field.type, where)


def _column(name: str, column: Any, where: str) -> np.ndarray:
    """A numeric or fixed-size-list column as an array (rows first)."""
    if column.null_count:
        raise DataError(f"cannot import {where}: column {name!r} has {column.null_count} null(s)")
    shape = _row_shape(name, column.type, where)
    values = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    for _ in shape:
        values = values.flatten()
    flat = values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat.reshape(len(column), *shape))


def _split_labels(column: Any, where: str) -> np.ndarray:
    """The 'split' column's values, one per row (object), without a Python object per row."""
    if column.null_count:
        raise DataError(
            f"cannot import {where}: column 'split' has {column.null_count} null(s); give "
            "every row train or test"
        )
    import pyarrow as pa

    parts = [np.empty(0, dtype=object)]
    for chunk in column.chunks:
        coded = chunk if pa.types.is_dictionary(chunk.type) else chunk.dictionary_encode()
        values = np.empty(len(coded.dictionary), dtype=object)
        values[:] = coded.dictionary.to_pylist()
        parts.append(values[coded.indices.to_numpy(zero_copy_only=False)])
    return np.concatenate(parts)


def _read_ipc(p: Path) -> Any:
    """An Arrow IPC file or stream: schema checked, decoded size checked, then read."""
    import pyarrow as pa
    import pyarrow.ipc

    with pa.memory_map(str(p)) as source:
        # The file format is the stream format between a magic and a footer: both are
        # read as the stream, so that what is checked is what is read.
        start = 8 if source.read(6) == b"ARROW1" else 0
        source.seek(start)
        _check_schema(pyarrow.ipc.open_stream(source).schema, str(p))
        source.seek(start)
        refuse_over_limit(str(p), ipc_decoded_bytes(source), p.stat().st_size)
        source.seek(start)
        return pyarrow.ipc.open_stream(source).read_all()


def _read_parquet(p: Path) -> Any:
    """A Parquet file, read within the import's ceiling (:mod:`vcdl.data.parquet_read`)."""
    return read_parquet(p, _check_schema)


def _read_table(p: Path) -> Any:
    import pyarrow as pa

    try:
        table = _read_ipc(p) if p.suffix in (".arrow", ".feather", ".ipc") else _read_parquet(p)
        # A damaged file can hold offsets past its buffers, which Arrow's kernels would
        # follow (a segfault): every array is checked whole before anything reads it.
        table.validate(full=True)
        return table
    except DataError:
        raise
    except (pa.ArrowException, OSError, ValueError, struct.error, IndexError) as exc:
        raise DataError(
            f"cannot import {p}: not a readable Parquet or Arrow file ({_reason(exc)})"
        ) from exc


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
    regular_file(p)
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
        labels = _split_labels(split_col, str(p))
        unknown = sorted({str(v) for v in set(labels)} - set(SPLITS))
        if unknown:
            raise DataError(
                f"cannot import {p}: column 'split' holds {unknown[:10]}; use train and test"
            )
        splits = {s: {n: a[labels == s] for n, a in arrays.items()} for s in SPLITS}
    del table, columns
    arrays.clear()
    return _write(store, name, splits, f"table:{p.resolve()}", num_classes)

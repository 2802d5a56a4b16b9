"""Writing a data set: its arrays checked, fingerprinted and written, visible only once whole.

This module owns the writers of the layout :mod:`vcdl.data.datasets` describes:
:func:`write_arrays` (named arrays per split, any numeric dtype) and
:func:`write_dataset` (the classification convention, ``x`` and integer labels
``y``), the checks they make before anything is written (names, dtypes, finite
floats, rows, the same fields in every split), the content hash
(:func:`dataset_fingerprint`), and the write itself: arrays chunked along rows
(about ``CHUNK_BYTES`` per chunk), the attributes, and ``complete`` last; a
write cut short removes what it wrote. Opening and reading rows are
:mod:`vcdl.data.datasets`'s.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vcdl.data.datasets import (
    CHUNK_BYTES,
    FORMAT,
    SPLITS,
    ArrayInfo,
    DatasetInfo,
    DatasetStore,
    SplitInfo,
    check_name,
    group_path,
)
from vcdl.errors import DataError

__all__ = ["dataset_fingerprint", "write_arrays", "write_dataset"]

_FIELD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _ordered(splits: Sequence[str], fields: Sequence[str]) -> list[tuple[str, str]]:
    """(split, field) in hashing order: train, test, then other splits; x, y, then others."""

    def rank(first: tuple[str, ...], name: str) -> tuple[int, str]:
        return (first.index(name), "") if name in first else (len(first), name)

    return [
        (s, f)
        for s in sorted(splits, key=lambda s: rank(SPLITS, s))
        for f in sorted(fields, key=lambda f: rank(("x", "y"), f))
    ]


def dataset_fingerprint(splits: Mapping[str, Mapping[str, np.ndarray]]) -> str:
    """Content hash of a data set's arrays, ``"sha256:<hex>"``.

    Hashes each array's ``<field>_<split>`` name, dtype, shape and
    little-endian C-order bytes in a fixed order, so equal data gives an
    equal fingerprint whatever the chunking in the store (and an ``x``/``y``
    data set the fingerprint vcdl gave it before named arrays).
    """
    h = hashlib.sha256()
    fields = sorted({f for arrays in splits.values() for f in arrays})
    for split, name in _ordered(list(splits), fields):
        a = np.ascontiguousarray(splits[split][name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(f"{name}_{split}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.data)
    return f"sha256:{h.hexdigest()}"


def _as_array(where: str, value: Any) -> np.ndarray:
    """``value`` as a numeric array of at least one dimension (rows), finite if floating."""
    a = np.asarray(value)
    if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
        pass
    elif np.issubdtype(a.dtype, np.floating):
        if not np.isfinite(a).all():
            bad = int(np.count_nonzero(~np.isfinite(a)))
            raise DataError(f"{where} has {bad} non-finite value(s) (NaN or Inf)")
    else:
        raise DataError(
            f"{where} must hold numbers (integers, floats or booleans), got dtype {a.dtype}"
        )
    if a.ndim < 1:
        raise DataError(f"{where} must have shape (rows, ...), got a scalar")
    return np.ascontiguousarray(a)


def _rows_per_chunk(rows: int, row_bytes: int) -> int:
    return max(1, min(rows, CHUNK_BYTES // max(1, row_bytes)))


def write_arrays(
    store: DatasetStore,
    name: str,
    splits: Mapping[str, Mapping[str, Any]],
    *,
    source: str,
    hints: Mapping[str, Any] | None = None,
    stats: Mapping[str, float] | None = None,
) -> DatasetInfo:
    """Validate and write a data set of named arrays to ``datasets/<name>``, replacing any old one.

    ``splits`` maps ``"train"`` and ``"test"`` (others allowed) to arrays by
    field name, each with the rows along its first axis; every split has the
    same fields, with the same dtype and row shape. Dtypes are kept.
    ``hints`` are recorded for model factories (``num_classes``,
    ``vocab_size``, ``context_length``); ``stats`` are figures about the
    rows for people (:attr:`DatasetInfo.stats`). Raises :class:`DataError` naming the
    first problem found, before anything is written.
    """
    check_name(name)
    missing = [s for s in SPLITS if s not in splits]
    if missing:
        raise DataError(f"a data set needs the splits {', '.join(SPLITS)}; missing {missing}")
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for split, given in splits.items():
        if not _FIELD_RE.fullmatch(split):
            raise DataError(f"invalid split name {split!r}: letters, digits and '_'")
        if not given:
            raise DataError(f"the {split} split has no arrays")
        arrays[split] = {}
        for f, value in given.items():
            if not _FIELD_RE.fullmatch(f):
                raise DataError(f"invalid field name {f!r}: a letter, then letters, digits, '_'")
            arrays[split][f] = _as_array(f"{f}_{split}", value)
        rows = {len(a) for a in arrays[split].values()}
        if len(rows) != 1:
            sizes = ", ".join(f"{f} {len(a)}" for f, a in arrays[split].items())
            raise DataError(f"the {split} split's arrays differ in rows ({sizes})")
        if rows == {0}:
            raise DataError(f"the {split} split is empty: need at least 1 row")
    train = arrays["train"]
    for split, fields in arrays.items():
        if set(fields) != set(train):
            raise DataError(
                f"the {split} split has fields {sorted(fields)}, the train split {sorted(train)}"
            )
        for f, a in fields.items():
            t = train[f]
            if a.dtype != t.dtype or a.shape[1:] != t.shape[1:]:
                raise DataError(
                    f"{f}_{split} is {a.dtype} with rows of shape {a.shape[1:]}, but "
                    f"{f}_train is {t.dtype} with rows of shape {t.shape[1:]}"
                )

    infos = {}
    for split, fields in arrays.items():
        described = {
            f: ArrayInfo(a.dtype.name, tuple(int(d) for d in a.shape[1:]))
            for f, a in fields.items()
        }
        n = len(next(iter(fields.values())))
        row_bytes = sum(i.row_bytes for i in described.values())
        infos[split] = SplitInfo(n, _rows_per_chunk(n, row_bytes), described)
    info = DatasetInfo(
        name=name,
        fingerprint=dataset_fingerprint(arrays),
        source=source,
        splits=infos,
        hints=dict(hints or {}),
        stats={k: float(v) for k, v in (stats or {}).items()},
    )
    try:
        _write_group(store, name, arrays, info)
    except BaseException:
        # A write cut short (a full disk, Ctrl-C) leaves no half data set, which
        # no reader saw (no "complete") and nothing else would remove.
        with contextlib.suppress(Exception):
            store.delete(group_path(name))
        raise
    return info


def _write_group(
    store: DatasetStore, name: str, arrays: dict[str, dict[str, np.ndarray]], info: DatasetInfo
) -> None:
    group = store.open_group(group_path(name), mode="w")
    for split, fields in arrays.items():
        chunk = info.splits[split].rows_per_chunk
        for f, a in fields.items():
            group.create_array(f"{split}/{f}", data=a, chunks=(chunk, *a.shape[1:]))
    group.update_attributes(
        {
            "format": FORMAT,
            "name": name,
            "source": info.source,
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
            "fingerprint": info.fingerprint,
            "hints": info.hints,
            "stats": dict(info.stats),
            "splits": {
                s: {
                    "rows": i.rows,
                    "rows_per_chunk": i.rows_per_chunk,
                    "arrays": {
                        f: {"dtype": a.dtype, "shape": list(a.shape)} for f, a in i.arrays.items()
                    },
                }
                for s, i in info.splits.items()
            },
        }
    )
    # Last: until this lands, readers see no data set (zarr has no rename).
    group.update_attributes({"complete": True})


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
    """Write a classification data set: samples ``x`` and integer labels ``y`` per split.

    x keeps its dtype (with shape ``(rows, *input_shape)``); y holds integer
    labels in ``[0, num_classes)``, one per row. ``num_classes`` defaults to
    the largest label + 1; pass it when the top class may be absent.
    Raises :class:`DataError` naming the first problem found.
    """
    check_name(name)
    splits = {"train": (x_train, y_train), "test": (x_test, y_test)}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for split, (x, y) in splits.items():
        xs, ys = _as_array(f"x_{split}", x), np.asarray(y)
        if xs.ndim < 2:
            raise DataError(
                f"x_{split} must have shape (rows, *sample_shape), got shape {xs.shape}"
            )
        if not np.issubdtype(ys.dtype, np.integer):
            raise DataError(
                f"y_{split} must hold integer class labels, got dtype {ys.dtype}; "
                "convert with y.astype(np.int64)"
            )
        if ys.ndim != 1:
            raise DataError(f"y_{split} must be 1-D (one label per row), got shape {ys.shape}")
        if len(xs) == 0:
            raise DataError(f"the {split} split is empty: need at least 1 row")
        if len(xs) != len(ys):
            raise DataError(f"x_{split} has {len(xs)} rows but y_{split} has {len(ys)}")
        arrays[split] = {"x": xs, "y": np.ascontiguousarray(ys)}
    if arrays["train"]["x"].shape[1:] != arrays["test"]["x"].shape[1:]:
        raise DataError(
            f"x_train samples have shape {arrays['train']['x'].shape[1:]} but x_test samples "
            f"{arrays['test']['x'].shape[1:]}"
        )
    labels = [arrays[s]["y"] for s in splits]
    lo, hi = min(int(y.min()) for y in labels), max(int(y.max()) for y in labels)
    classes = operator.index(num_classes) if num_classes is not None else hi + 1
    if classes < 1:
        raise DataError(f"num_classes must be >= 1, got {classes}")
    if lo < 0 or hi >= classes:
        raise DataError(
            f"labels must be integers in [0, {classes}), found values from {lo} to {hi}"
        )
    return write_arrays(store, name, arrays, source=source, hints={"num_classes": classes})

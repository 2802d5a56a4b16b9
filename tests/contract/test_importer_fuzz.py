"""Issue 54: mutated .npz, Arrow, Parquet and text files are imported or refused in one line.

Text (hypothesis, a fixed draw of 120 in the default suite): any bytes, odd
encodings (UTF-16/32 with BOMs, Latin-1, NULs, CRLF), a few bytes changed,
any context (to 2**80) and test fraction (NaN, 0, 1, infinities); a refusal
leaves nothing in the store.

Seeded byte flips, truncations and splices of small valid files; every
outcome is a data set or a :class:`~vcdl.errors.DataError` (the CLI's exit
2), never another exception. A crash found here becomes a pinned case: seed
54 found a ``zlib.error`` from a damaged deflate stream and a Parquet error
spanning two lines; seed 7 found Arrow files whose string offsets point past their buffers
(rounds 36 and 55 of the file, 54 of the stream), which Arrow's kernels
would follow: one such file segfaulted the importer (in a longer run of
this seed) until every table was validated whole before use.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcdl.data import import_npz, import_table, import_text
from vcdl.errors import DataError
from vcdl.store import WeightStore

ROUNDS = 60


def _npz() -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    np.savez_compressed(buf, x=rng.normal(size=(20, 3)), y=rng.integers(0, 3, 20))
    return buf.getvalue()


def _table() -> pa.Table:
    rng = np.random.default_rng(1)
    return pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=40)), 2),
            "y": pa.array(rng.integers(0, 3, 20), type=pa.int8()),
            "split": pa.array(["train", "test"] * 10),
        }
    )


def _arrow(stream: bool) -> Callable[[], bytes]:
    def make() -> bytes:
        sink = pa.BufferOutputStream()
        new = pyarrow.ipc.new_stream if stream else pyarrow.ipc.new_file
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with new(sink, _table().schema, options=options) as writer:
            writer.write_table(_table())
        return bytes(sink.getvalue().to_pybytes())

    return make


def _parquet() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(_table(), sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    how = rng.integers(0, 4)
    if how == 0:  # flip a few bytes
        for i in rng.integers(0, len(out), size=rng.integers(1, 8)):
            out[i] = int(rng.integers(0, 256))
    elif how == 1:  # truncate
        del out[int(rng.integers(0, len(out))) :]
    elif how == 2:  # large numbers where lengths live
        i = int(rng.integers(0, max(len(out) - 8, 1)))
        out[i : i + 8] = int(rng.integers(0, 2**62)).to_bytes(8, "little")
    else:  # splice a piece elsewhere
        a, b = sorted(int(v) for v in rng.integers(0, len(out), size=2))
        out[int(rng.integers(0, len(out))) :][:0] = out[a:b]
    return bytes(out)


@pytest.mark.parametrize("seed", [54, 7])
@pytest.mark.parametrize(
    ("suffix", "make", "importer"),
    [
        (".npz", _npz, import_npz),
        (".arrow", _arrow(True), import_table),
        (".feather", _arrow(False), import_table),
        (".parquet", _parquet, import_table),
    ],
    ids=["npz", "arrow-stream", "arrow-file", "parquet"],
)
def test_a_mutated_file_is_imported_or_refused_in_one_line(
    suffix: str,
    make: Callable[[], bytes],
    importer: Callable[..., object],
    seed: int,
    tmp_path: Path,
) -> None:
    store = WeightStore(str(tmp_path / "store"))
    original = make()
    rng = np.random.default_rng(seed)
    for round_ in range(ROUNDS):
        path = tmp_path / f"m{round_}{suffix}"
        path.write_bytes(_mutate(original, rng))
        try:
            importer(store, path, f"m{round_}")
        except DataError as exc:
            assert "\n" not in str(exc), str(exc)
        path.unlink()


# --------------------------------------------------------------------------
# Text: mutated bytes, odd encodings, any --context and --test-fraction
# --------------------------------------------------------------------------

_PROSE = "The quick brown fox jumps over the lazy dog. Ça va? Grüße, 東京.\n" * 8

# Texts as a user's files hold them: encodings with and without BOMs, binary
# junk, line endings, NULs, a single byte, nothing at all.
texts = st.one_of(
    st.sampled_from(
        [
            b"",
            b"\n",
            b"a",
            b"\x00" * 300,
            _PROSE.encode("utf-8"),
            _PROSE.encode("utf-8-sig"),
            _PROSE.encode("utf-16"),
            _PROSE.encode("utf-32"),
            _PROSE.encode("latin-1", errors="replace"),
            _PROSE.replace("\n", "\r\n").encode(),
            bytes(range(256)) * 4,
        ]
    ),
    st.binary(max_size=2000),
    st.text(max_size=500).map(lambda t: t.encode("utf-8", errors="surrogatepass")),
)
contexts = st.one_of(
    st.integers(min_value=-3, max_value=600),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 10**19, 2**80]),
)
fractions = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, -0.0, 5e-324, 0.5, 0.9999999, 1e-9]),
)


_NAMES = itertools.count()


@pytest.fixture(scope="module")
def text_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[WeightStore, Path]:
    folder = tmp_path_factory.mktemp("text-fuzz")
    return WeightStore(str(folder / "store")), folder


# VCDL_FUZZ_EXAMPLES=3000 explores further, a new random draw each run.
EXAMPLES = int(os.environ.get("VCDL_FUZZ_EXAMPLES", "0")) or None


@settings(
    max_examples=EXAMPLES or 120,
    deadline=None,
    derandomize=EXAMPLES is None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    text=texts,
    flips=st.lists(st.integers(0, 2**16), max_size=4),
    context=contexts,
    fraction=fractions,
)
def test_a_text_of_any_bytes_and_context_is_imported_or_one_line_and_nothing_written(
    text_store: tuple[WeightStore, Path],
    text: bytes,
    flips: list[int],
    context: int,
    fraction: float,
) -> None:
    store, folder = text_store
    data = bytearray(text)
    for f in flips:  # a few bytes of the text changed
        if data:
            data[f % len(data)] = f & 0xFF
    path = folder / "input.txt"
    path.write_bytes(bytes(data))
    name = f"t{next(_NAMES)}"
    try:
        info = import_text(store, path, name, context=context, test_fraction=fraction)
    except DataError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)
        # Refused: nothing in the store, not even a partial group.
        assert name not in store.list("datasets"), store.list(f"datasets/{name}")
        return
    assert name in store.list("datasets")  # what a refusal is checked against
    assert info.splits["train"].rows >= 1 and info.splits["test"].rows >= 1
    assert info.hints["context_length"] == context

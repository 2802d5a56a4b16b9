"""Issue 54: hostile files given to ``vcdl data import``, refused before they are decoded.

Through the CLI, as a user runs it: an ``.npz`` zip bomb (a 1 GiB member of
zeros in about 1 MB), ``.npz`` members whose headers claim petabytes
whatever their names, members that are not arrays, 0-d arrays, duplicate
names, an Arrow IPC stream and file and a Parquet file that decode to 1 GiB
from a few hundred KB, a Parquet file whose footer says 1,000 rows over a
page of 1 GiB (tests/parquetcraft.py), a CSV given as a table, ``/dev/zero``,
a FIFO, and a context length no text can fill. Each is exit 2 and one line,
no traceback, and nothing written: a home holding a data set, a ledger and a
log is byte for byte what it was (tests/homesnap.py). The peak memory of a
refused import, measured in a child process, stays within 256 MB of a child
that only imports the modules.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from vcdl.cli import main

from ..homesnap import assert_unchanged, copy_home, populated_home, snapshot
from ..parquetcraft import lying_parquet

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# it measures memory.
pytestmark = pytest.mark.alone

GIB = 1 << 30
PEAK_ALLOWED = 256 << 20


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return np.lib.format.magic(1, 0) + header.getvalue()[8:]


def _zip_bomb(path: Path) -> None:
    """An .npz whose member x.npy is 1 GiB of float64 zeros, deflated to about 1 MB."""
    zeros = bytes(16 << 20)
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("x.npy", "w", force_zip64=True) as f,
    ):
        f.write(_npy_header((GIB // 8,)))
        for _ in range(GIB // len(zeros)):
            f.write(zeros)


def _claim_unsuffixed(path: Path) -> None:
    """A member named without .npy whose header claims 1.5 PiB (and holds nothing)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x", _npy_header((3 * 2**46, 1)))


def _not_an_array(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", _npy_header((4,)) + bytes(32))
        archive.writestr("notes.txt", b"hello, these are not numbers")


def _zero_d(path: Path) -> None:
    np.savez(path, x=np.float64(1.0), y=np.float64(2.0))


def _duplicate(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("x.npy", _npy_header((4,)) + bytes(32))
            archive.writestr("x.npy", _npy_header((4,)) + bytes(32))


def _truncated(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", _npy_header((100,)) + bytes(8))


def _zeros_table() -> pa.Table:
    # np.zeros maps zero pages: 1 GiB that costs no memory until written.
    return pa.table({"x": pa.array(np.zeros(GIB // 8))})


def _ipc(path: Path, *, stream: bool) -> None:
    table = _zeros_table()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.OSFile(str(path), "wb") as sink:
        new = pyarrow.ipc.new_stream if stream else pyarrow.ipc.new_file
        with new(sink, table.schema, options=options) as writer:
            writer.write_table(table)


def _parquet(path: Path) -> None:
    pq.write_table(_zeros_table(), path, compression="zstd")


# name -> (file name, how to make it, extra arguments, what the one line says)
CASES: dict[str, tuple[str, Callable[[Path], None] | None, list[str], str]] = {
    "npz-zip-bomb": ("bomb.npz", _zip_bomb, [], "would decode to 1.0 GiB"),
    "npz-unsuffixed-claim": ("claim.npz", _claim_unsuffixed, [], "over the import limit"),
    "npz-not-an-array": ("mixed.npz", _not_an_array, [], "'notes.txt' is not a NumPy array"),
    "npz-0-d": ("scalars.npz", _zero_d, [], "is 0-d (a single value)"),
    "npz-duplicate-names": ("twice.npz", _duplicate, [], "two members named 'x'"),
    "npz-truncated": ("short.npz", _truncated, [], "the archive is damaged"),
    "ipc-stream-bomb": ("bomb.arrow", lambda p: _ipc(p, stream=True), [], "would decode to"),
    "ipc-file-bomb": ("bomb.feather", lambda p: _ipc(p, stream=False), [], "would decode to"),
    "parquet-bomb": ("bomb.parquet", _parquet, [], "would decode to 1.0 GiB"),
    "parquet-page-bomb": (
        "pages.parquet",
        lambda p: lying_parquet(p, page_bytes=GIB),
        [],
        "(by its page headers): 33.3 KiB would decode to 2.0 GiB",
    ),
    "csv-as-table": (
        "rows.csv",
        lambda p: p.write_text("x,y\n1,2\n3,4\n"),
        ["--format", "table"],
        "not a readable Parquet or Arrow file",
    ),
    "dev-zero": ("/dev/zero", None, [], "not a regular file"),
    "dev-zero-npz": ("/dev/zero", None, ["--format", "npz"], "not a regular file"),
    "fifo": ("pipe.txt", lambda p: os.mkfifo(p), [], "not a regular file"),
    "fifo-table": ("pipe.parquet", lambda p: os.mkfifo(p), [], "not a regular file"),
    "huge-context": (
        "short.txt",
        lambda p: p.write_bytes(b"some text " * 100),
        ["--context", str(10**19)],
        "make no rows of 10000000000000000001 tokens",
    ),
}

#: The cases whose decoding would take far more than the allowed peak.
BOMBS = [
    "npz-zip-bomb",
    "npz-unsuffixed-claim",
    "ipc-stream-bomb",
    "parquet-bomb",
    "parquet-page-bomb",
    "dev-zero",
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each case's input, made once for the module (the bombs take a few seconds)."""
    folder = tmp_path_factory.mktemp("inputs")
    paths = {}
    for case, (name, make, _, _) in CASES.items():
        path = Path(name) if name.startswith("/") else folder / name
        if make is not None and not path.exists():
            make(path)
        paths[case] = path
    return paths


@pytest.fixture(scope="module")
def home_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home as a user has one: a data set, a ledger, a log."""
    return populated_home(tmp_path_factory.mktemp("template") / "home")


def _argv(path: Path, home: Path, extra: list[str]) -> list[str]:
    return ["data", "import", str(path), "--name", "x", "--home", str(home), *extra]


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_import_is_exit_2_one_line_and_writes_nothing(
    case: str,
    inputs: dict[str, Path],
    home_template: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, _, extra, needle = CASES[case]
    home = copy_home(home_template, tmp_path / "home")
    before = snapshot(home)
    with pytest.raises(SystemExit) as info:
        main(_argv(inputs[case], home, extra))
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert info.value.code == 2, err
    assert 1 <= len(lines) <= 3 and "Traceback" not in out + err, out + err
    assert lines[0].startswith("vcdl: error: ") and needle in lines[0], lines[0]
    assert_unchanged(before, home)


def _child_peak(code: str, *args: str) -> tuple[int, int, str]:
    """(exit status, peak resident bytes, stderr) of a fresh interpreter running ``code``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, err  # Linux: ru_maxrss in KiB


MODULES = (
    "import vcdl.cli, vcdl.cli.data, vcdl.api, vcdl.data, vcdl.data.importers, vcdl.store, "
    "numpy, pyarrow, pyarrow.ipc, pyarrow.parquet, zipfile"
)


def test_a_refused_bomb_peaks_within_256_mb_of_the_imports_alone(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    code, baseline, err = _child_peak(MODULES)
    assert code == 0, err
    run = "import sys; from vcdl.cli import main; main(sys.argv[1:])"
    peaks = {}
    for case in BOMBS:
        _, _, extra, _ = CASES[case]
        code, peak, err = _child_peak(run, *_argv(inputs[case], tmp_path / case, extra))
        assert code == 2 and "Traceback" not in err, err
        peaks[case] = peak
    over = {c: (p - baseline) >> 20 for c, p in peaks.items()}
    print(f"MiB above the {baseline >> 20} MiB baseline: {over}")
    assert all(p - baseline < PEAK_ALLOWED for p in peaks.values()), (
        f"MiB above the {baseline >> 20} MiB baseline: {over}"
    )

"""Bad numbers, names and files in a config or on the command line: exit 2, one line, nothing
written (issue 54's second set of hostile input)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vcdl.cli import main

from ..homesnap import assert_unchanged, copy_home, populated_home, snapshot

REPO = Path(__file__).resolve().parents[2]


def vcdl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int | str | None, str]:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    return ended.value.code, capsys.readouterr().err


BAD_VALUES = [
    ("run.seed=1208925819614629174706176", "less than or equal to 4294967295"),
    ("train.lr=true", "train.lr: must be a number, not a string or true/false (got True)"),
    ('run.epochs="1"', "run.epochs: must be a number, not a string or true/false (got '1')"),
    ('merge.fold="2"', "merge.fold: must be a number"),
    ('run.name="."', "cannot name a run"),
    ('run.name=".."', "cannot name a run"),
    ('run.name="__x"', "cannot name a run"),
    # No cluster.address: vcdl's LocalCluster workers offer no GPU (it waited forever).
    ("cluster.task_resources={GPU=1}", "asks each shard task for GPU=1, but the 2 local"),
]


@pytest.mark.parametrize(("setting", "said"), BAD_VALUES)
def test_a_bad_value_is_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, said: str
) -> None:
    home = tmp_path / "home"
    code, err = vcdl(
        capsys,
        "train",
        str(REPO / "examples" / "digits.toml"),
        "--set",
        setting,
        "--home",
        str(home),
    )
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) <= 3 and "Traceback" not in err, err
    assert said in lines[-1], err
    assert not home.exists() or not any(home.iterdir())


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.toml"
    os.mkfifo(path)
    return path


def _deep(tmp_path: Path) -> Path:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "{b = " * 10_000 + "1" + "}" * 10_000 + "\n")
    return path


def _huge(tmp_path: Path) -> Path:
    path = tmp_path / "big.toml"
    path.write_text("# padding\n" * 200_000)  # 2 MB of comments
    return path


BAD_FILES = [
    (_fifo, "is not a regular file"),
    (lambda _: Path("/dev/zero"), "is not a regular file"),
    (_deep, "nests tables too deeply"),
    (lambda p: p / "nope.toml", "not found"),
]


@pytest.mark.parametrize(("make", "said"), BAD_FILES)
def test_a_config_that_is_no_config_file_is_refused_without_reading_it_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, said: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    home = tmp_path / "home"
    code, err = vcdl(capsys, "train", str(path), "--home", str(home))
    assert code == 2 and said in err.strip().splitlines()[-1], err
    assert "Traceback" not in err and not home.exists()


def test_a_huge_config_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = vcdl(capsys, "train", str(_huge(tmp_path)), "--home", str(tmp_path / "home"))
    assert code == 2 and "over 1 MiB" in err, err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("export", "r", "--version", str(2**80), "--out", "x.pt"), "out of range: 0 to"),
        (("evaluate", "r", "--version", "-1"), "-1 is out of range"),
        (("train", "x.toml", "--workers", "0"), "0 is out of range: 1 to 1024"),
        (("resume", "r", "--workers", "2000"), "2000 is out of range"),
    ],
)
def test_an_out_of_range_number_on_the_command_line_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], said: str
) -> None:
    code, err = vcdl(capsys, *args, "--home", str(tmp_path / "home"))
    assert code == 2 and said in err.strip().splitlines()[-1] and "Traceback" not in err, err
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("home", "said"),
    [
        ("file", "is a file, not a folder"),
        ("file/sub", "which is a file, not a folder"),
        ("/proc", "--home /proc: cannot make a folder there"),
        ("/proc/vcdl-home", "--home /proc/vcdl-home: cannot make a folder there (in /proc)"),
    ],
)
@pytest.mark.parametrize(
    "command", [("train", str(REPO / "examples" / "digits.toml")), ("data", "make", "digits")]
)
def test_a_home_that_cannot_be_a_folder_is_refused_naming_the_option(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    home: str,
    said: str,
    command: tuple[str, ...],
) -> None:
    """Before: exit 1, blaming store.url, once the first write under it failed."""
    (tmp_path / "file").write_text("not a folder")
    before = sorted(tmp_path.iterdir())
    code, err = vcdl(
        capsys, *command, "--home", str(tmp_path / home) if not home.startswith("/") else home
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert said in lines[0] and "--home" in lines[0] and "store.url" not in lines[0], err
    assert "pass a folder" in lines[0], err
    assert sorted(tmp_path.iterdir()) == before
    assert (tmp_path / "file").read_text() == "not a folder"


LONG = "a" * 10_000


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("train", "CONFIG", "--run", ""),
            "--run: an empty run name; give one, or leave --run out",
        ),
        (("data", "make", "digits", "--name", ""), "--name: an empty data set name; give one,"),
        (("data", "import", "FILE", "--name", ""), "--name: an empty data set name; give one"),
        (("train", "CONFIG", "--run", LONG), "is 10000 characters long; give a run name of at"),
        (("data", "make", "digits", "--name", LONG), "give a data set name of at most 100"),
        (("data", "import", "FILE", "--name", LONG), "give a data set name of at most 100"),
        (("data", "make", "digits", "--name", "a/b"), "'a/b' cannot name a data set; use"),
        (("train", "CONFIG", "--set", f'data.name="{LONG}"'), "data.name: String should have at"),
        (("train", "CONFIG", "--set", f'run.name="{LONG}"'), "run.name: String should have at"),
    ],
    ids=[
        "empty-run",
        "empty-made-set",
        "empty-imported-set",
        "long-run",
        "long-made-set",
        "long-imported-set",
        "slash",
        "long-data-name-in-config",
        "long-run-name-in-config",
    ],
)
def test_an_empty_or_huge_name_is_refused_in_one_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], said: str
) -> None:
    """Before: --name '' became the kind's name, --run '' the config's; a 10,000-character
    data-set name ended in exit 1 and a 20-KB line."""
    source = tmp_path / "input.npz"
    source.write_bytes(b"not read")
    where = {"CONFIG": str(REPO / "examples" / "digits.toml"), "FILE": str(source)}
    home = tmp_path / "home"
    code, err = vcdl(capsys, *(where.get(a, a) for a in args), "--home", str(home))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert said in lines[0] and len(lines[0]) < 300, err
    assert not home.exists()


def test_the_api_refuses_an_empty_run_name_too(tmp_path: Path) -> None:
    from vcdl import api
    from vcdl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"run\.name"):
        api.resolve(REPO / "examples" / "digits.toml", run_name="", home=tmp_path / "home")
    assert not (tmp_path / "home").exists()


def _log_folder(logs: Path) -> None:
    (logs / "digits.log").mkdir(parents=True)


def _logs_file(logs: Path) -> None:
    logs.write_text("a file where the logs folder goes")


def _log_fifo(logs: Path) -> None:
    logs.mkdir()
    os.mkfifo(logs / "digits.log")


def _log_read_only(logs: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes a read-only file")
    logs.mkdir()
    (logs / "digits.log").write_text("")
    (logs / "digits.log").chmod(0o444)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_log_folder, "digits.log: it is a folder; move it out of the way, or pass another --home"),
        (_logs_file, "logs is a file, not a folder; move "),
        (_log_fifo, "digits.log: it is not a regular file; move it out of the way"),
        (_log_read_only, "digits.log: it cannot be written (Permission denied)"),
    ],
    ids=["log-is-a-folder", "logs-is-a-file", "log-is-a-fifo", "log-read-only"],
)
def test_a_run_log_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, said: str
) -> None:
    """Before: an IsADirectoryError (FileExistsError for a logs file) traceback, with
    Prefect's home already made."""
    home = tmp_path / "home"
    home.mkdir()
    make(home / "logs")  # type: ignore[operator]
    before = snapshot(home)
    code, err = vcdl(capsys, "train", str(REPO / "examples" / "digits.toml"), "--home", str(home))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert said in lines[0], err
    # Refused before the preflight: no built-in data set made (it was), no ledger, no Prefect.
    assert_unchanged(before, home)


def test_resources_local_workers_offer_are_not_refused() -> None:
    import dask

    from vcdl.config import parse_config
    from vcdl.reach import local_resources_problem

    gpu = parse_config({"cluster": {"task_resources": {"GPU": 1}}}).cluster
    assert "offer none: no task could ever start" in str(local_resources_problem(gpu))
    # Dask's own config (DASK_DISTRIBUTED__WORKER__RESOURCES__GPU=1) gives local workers some.
    with dask.config.set({"distributed.worker.resources": {"GPU": 1}}):
        assert local_resources_problem(gpu) is None
    with dask.config.set({"distributed.worker.resources": {"GPU": 0.5}}):
        assert "offer GPU=0.5" in str(local_resources_problem(gpu))
    # A scheduler's workers may join later: not asked.
    remote = gpu.model_copy(update={"address": "tcp://10.0.0.1:8786"})
    assert local_resources_problem(remote) is None


# --------------------------------------------------------------------------
# Nothing written: a home with a data set, a ledger and a log, byte for byte
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def home_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return populated_home(tmp_path_factory.mktemp("template") / "home")


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "short.txt"
    path.write_text("some text " * 100)
    return path


DIGITS = str(REPO / "examples" / "digits.toml")
REFUSALS = [
    *((("train", DIGITS, "--set", setting), said) for setting, said in BAD_VALUES),
    *((("train", make), said) for make, said in [*BAD_FILES, (_huge, "over 1 MiB")]),
    (("train", DIGITS, "--run", "a" * 10_000), "give a run name of at most"),
    (("train", DIGITS, "--run", ""), "--run: an empty run name"),
    (("train", DIGITS, "--workers", "0"), "0 is out of range: 1 to 1024"),
    (("resume", "digits", "--workers", "2000"), "2000 is out of range"),
    (("resume", "nothing-of-that-name"), "nothing-of-that-name"),
    (("export", "digits", "--version", str(2**80), "--out", "x.pt"), "out of range: 0 to"),
    (("evaluate", "digits", "--version", str(2**80)), "out of range: 0 to"),
    (("data", "make", "digits", "--name", "a/b"), "'a/b' cannot name a data set; use"),
    (("data", "import", _text, "--name", "t", "--context", "1e19"), "invalid int value: '1e19'"),
    (("data", "import", _text, "--name", "t", "--context", "-1"), "context must be >= 1 token"),
]


@pytest.mark.parametrize(("args", "said"), REFUSALS)
def test_a_refusal_leaves_a_home_with_a_data_set_ledger_and_log_byte_for_byte(
    home_template: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: tuple[object, ...],
    said: str,
) -> None:
    """Every file under the home, its bytes, mode and time, and every folder: as before."""
    home = copy_home(home_template, tmp_path / "home")
    before = snapshot(home)
    argv = [str(a(tmp_path)) if callable(a) else str(a) for a in args]
    code, err = vcdl(capsys, *argv, "--home", str(home))
    lines = err.strip().splitlines()
    assert code == 2 and 1 <= len(lines) <= 3 and "Traceback" not in err, err
    assert said in lines[-1], err
    assert_unchanged(before, home)

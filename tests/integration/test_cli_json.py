"""``--json``: every reporting command prints one parseable document on stdout, and
its errors one document on stderr with the plain mode's exit code; and the
shell completion script names every command.

One small run (v0 and one merged attempt, trained in this process: no Prefect,
no Dask) is shared by the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vcdl.cli import main
from vcdl.cli.completion import command_tree, completion_script
from vcdl.cli.json_output import emit, json_mode
from vcdl.cli.parser import build_parser
from vcdl.config import parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.runs import prepare_run
from vcdl.worker.attempt import run_attempt

RUN = "j"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("json-home")
    cfg = parse_config(
        {
            "run": {"name": RUN, "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 500, "shards": 1},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "train": {"batch_size": 50},
        }
    ).with_locations(home)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 1)
    out = run_attempt(ref, 0, 0, config=cfg)
    assert merge_attempt(ref, str(out.attempt_id), cfg).kind == "merged"
    return home


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def _doc(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> Any:
    got, out, err = _cli([*argv, "--json"], capsys)
    assert got == code, err
    return json.loads(out)  # the whole of stdout is one document


def test_runs(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(["runs", "--home", str(home)], capsys)
    assert doc["ledger_found"] is True
    (run,) = doc["runs"]
    assert run["name"] == RUN and run["head_version"] == 1 and run["epochs"] == 1
    assert {"state", "epochs_completed", "created_at", "updated_at", "parent_run"} <= set(run)
    # No ledger yet is no error for a listing, as in the plain mode.
    assert _doc(["runs", "--home", str(tmp_path / "none")], capsys) == {
        "runs": [],
        "ledger_found": False,
    }


def test_status_audit_cost(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = _doc(["status", RUN, "--home", str(home)], capsys)
    assert status["run"] == RUN and status["head_version"] == 1
    assert status["attempts"] == {"merged": 1} and isinstance(status["history"], list)
    audit = _doc(["audit", RUN, "--home", str(home), "--deep"], capsys)
    assert audit == {"run": RUN, "deep": True, "ok": True, "violations": []}
    cost = _doc(["cost", RUN, "--home", str(home)], capsys)
    assert cost["run"] == RUN and cost["merged_samples"] > 0 and cost["total_usd"] >= 0


def test_data_list_make_import(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ds,) = _doc(["data", "list", "--home", str(home)], capsys)["datasets"]
    assert ds["name"] == "mnist1d" and ds["rows"] == {"train": 400, "test": 100}
    assert ds["fields"]["x"]["shape"] == [40] and ds["uri"].endswith("datasets/mnist1d")
    store = ["--store", str(tmp_path / "store")]
    made = _doc(["data", "make", "mnist1d", "--samples", "200", "--name", "m", *store], capsys)
    assert made["dataset"]["name"] == "m" and sum(made["dataset"]["rows"].values()) == 200
    npz = tmp_path / "toy.npz"
    rng = np.random.default_rng(0)
    np.savez(npz, x=rng.normal(size=(50, 3)).astype("float32"), y=rng.integers(0, 2, 50))
    imported = _doc(["data", "import", str(npz), "--name", "toy", *store], capsys)["dataset"]
    assert imported["name"] == "toy" and imported["fields"]["x"] == {
        "dtype": "float32",
        "shape": [3],
    }
    names = [d["name"] for d in _doc(["data", "list", *store], capsys)["datasets"]]
    assert sorted(names) == ["m", "toy"]


def test_evaluate_and_export(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = _doc(["evaluate", RUN, "--home", str(home), "--version", "1"], capsys)
    assert ev["version"] == 1 and ev["split"] == "test" and ev["samples"] == 100
    assert set(ev["metrics"]) >= {"loss", "accuracy"} and ev["loss"] == ev["metrics"]["loss"]
    out = tmp_path / "w.safetensors"
    ex = _doc(["export", RUN, "--home", str(home), "--out", str(out)], capsys)
    assert ex == {
        "run": RUN,
        "version": 1,
        "path": str(out.resolve()),
        "format": "safetensors",
        "bytes": out.stat().st_size,
    }


@pytest.mark.parametrize(
    ("argv", "kind", "code"),
    [
        (["status", "ghost"], "RunNotFound", 2),
        (["audit", "ghost"], "RunNotFound", 2),
        (["cost", "ghost"], "RunNotFound", 2),
        (["resume", "ghost"], "RunNotFound", 2),
        (["export", RUN, "--version", "99", "--out", "x.pt"], "VersionNotFound", 2),
        (["evaluate", RUN, "--version", "99"], "VersionNotFound", 2),
        (["evaluate", RUN, "--data", "nosuch"], "DataError", 2),
        (["export", RUN, "--out", "x.txt"], "ConfigError", 2),
        (["status"], "UsageError", 2),
        (["chaos", "bogus://x", "--rate", "1", "--duration", "1"], "ConfigError", 2),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else str(v),
)
def test_errors_are_one_document_on_stderr(
    argv: list[str], kind: str, code: int, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home_opt = [] if argv[0] == "chaos" else ["--home", str(home)]
    got, out, err = _cli([*argv, *home_opt, "--json"], capsys)
    assert got == code and out == "", (out, err)
    error = json.loads(err)["error"]
    assert error["type"] == kind and error["exit_code"] == code and error["message"], error
    # The plain mode exits the same way.
    assert _cli([*argv, *home_opt], capsys)[0] == code


def test_missing_ledger_and_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got, out, err = _cli(["status", RUN, "--home", str(tmp_path / "typo"), "--json"], capsys)
    assert got == 2 and out == ""
    assert json.loads(err)["error"]["type"] == "LedgerNotFound"
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[run]\nepochs = 'one'\n")
    got, out, err = _cli(["train", str(cfg), "--home", str(tmp_path), "--json"], capsys)
    assert got == 2 and out == "" and json.loads(err)["error"]["type"] == "ConfigError"


def test_a_process_writes_only_the_document_to_stdout(home: Path, tmp_path: Path) -> None:
    # The real descriptors: what a shell pipeline (`vcdl status RUN --json | jq`) reads.
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))

    cmd = [sys.executable, "-m", "vcdl.cli", "status", RUN, "--home", str(home), "--json"]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)["run"] == RUN, ok.stderr


def test_json_mode_sends_stray_output_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with json_mode():
        os.write(1, b"a worker's print\n")  # what a child process inheriting fd 1 writes
        print("a library's print")
        emit({"loss": float("nan"), "n": 1})
    out, err = capfd.readouterr()
    assert json.loads(out) == {"loss": None, "n": 1}  # strict JSON: NaN is null
    assert "a worker's print" in err and "a library's print" in err


def _subcommands() -> list[str]:
    tree = command_tree(build_parser())
    names = [c.name for c in tree.subcommands]
    names += [s.name for c in tree.subcommands for s in c.subcommands]
    return names


def _complete(script: Path, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last is the word being completed)."""
    line = " ".join(f"'{w}'" for w in words)
    probe = (
        f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        '_vcdl; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_bash_completion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(["completion", "bash"], capsys)
    assert code == 0
    script = tmp_path / "vcdl.bash"
    script.write_text(out)
    subprocess.run(["bash", "-n", str(script)], check=True)
    for name in _subcommands():
        assert name in out, name
    assert {"train", "runs", "data", "completion"} <= set(_complete(script, "vcdl", ""))
    assert _complete(script, "vcdl", "data", "l") == ["list"]
    assert _complete(script, "vcdl", "evaluate", "j", "--split", "") == ["train", "test"]
    assert "--json" in _complete(script, "vcdl", "status", "j", "--j")
    assert _complete(script, "vcdl", "data", "make", "--json", "d") == ["digits"]
    # A run called "list" is no subcommand of status.
    assert "--deep" in _complete(script, "vcdl", "audit", "list", "--d")


@pytest.mark.parametrize(("shell", "option"), [("zsh", "'--json'"), ("fish", "-l json")])
def test_other_shells_name_every_command(shell: str, option: str) -> None:
    # Neither shell is installed here: their scripts are checked for content only.
    script = completion_script(build_parser(), shell)
    for name in _subcommands():
        assert name in script, name
    assert option in script

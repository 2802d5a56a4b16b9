"""benchmarks/harness.py: the options, the median, the JSON line and its environment.

Every benchmark ends with the harness's one JSON line (the tests and
docs/results.md read it), takes its common options, and none edits the
import path: each runs as ``python -m benchmarks.NAME``.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
#: Modules of benchmarks/ that are no benchmark: the harness, helpers, and
#: ddp_train.py (a contender's trainer that torch.distributed.run starts),
#: io_limit*.py (big_merge.py's contenders for the machine's own limit).
NOT_BENCHMARKS = {
    "__init__",
    "harness",
    "cli_proc",
    "sleeper",
    "tta_common",
    "tta_contenders",
    "ddp_train",
    "io_limit",
    "io_limit_modes",
}


def _parser(**kwargs: object) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    harness.add_common_options(p, **kwargs)  # type: ignore[arg-type]
    return p


def test_median_odd_even_and_none() -> None:
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert harness.median(x for x in (5.0,)) == 5.0  # any iterable, once
    with pytest.raises(ValueError, match="no values"):
        harness.median([])


def test_common_options_defaults_and_values() -> None:
    p = _parser(quick_help="short", repeats_default=3)
    args = p.parse_args([])
    assert (args.quick, args.repeats, args.json, args.out) == (False, 3, False, None)
    args = p.parse_args(["--quick", "--repeats", "5", "--json", "--out", "x/s.json"])
    assert (args.quick, args.repeats, args.json, args.out) == (True, 5, True, Path("x/s.json"))
    # Without a short form or repeats, those options do not exist.
    bare = _parser(quick_help=None, repeats=False)
    with pytest.raises(SystemExit):
        bare.parse_args(["--quick"])
    with pytest.raises(SystemExit):
        bare.parse_args(["--repeats", "2"])
    assert bare.parse_args(["--json"]).json is True


def test_run_environment_names_commit_machine_and_versions() -> None:
    env = harness.run_environment()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if head.returncode == 0:
        assert env["commit"] == head.stdout.strip()
        assert isinstance(env["dirty"], bool)
    else:
        assert env["commit"] == "unknown"
    assert env["cpus"] and env["machine"] and env["hostname"]
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    versions = env["versions"]
    for dist in ("torch", "dask", "prefect", "zarr"):
        assert versions[dist], versions
    import torch

    assert versions["torch"] == torch.__version__
    assert env["utc"].endswith("+00:00")


def test_emit_summary_prints_one_line_and_writes_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deep" / "summary.json"
    args = _parser(quick_help="q", repeats_default=1).parse_args(["--out", str(out)])
    figures = {"results": {"a": 1.5}, "verdict": "PASS"}
    returned = harness.emit_summary("demo", figures, args)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line == returned
    assert next(iter(line)) == "benchmark" and line["benchmark"] == "demo"
    assert line["results"] == {"a": 1.5} and line["verdict"] == "PASS"
    assert set(line["env"]) >= {"commit", "hostname", "cpus", "python", "versions", "utc"}
    assert json.loads(out.read_text()) == line
    # A figures' own "benchmark" name is kept (ledger.py's is ledger_merges).
    kept = harness.emit_summary("ledger", {"benchmark": "ledger_merges"})
    assert kept["benchmark"] == "ledger_merges"


def test_json_sends_the_tables_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    p = _parser(quick_help="q", repeats_default=1)
    for flags, table_on_stdout in (([], True), (["--json"], False)):
        args = p.parse_args(flags)
        with harness.human_output(args):
            print("a table row")
            subprocess.run([sys.executable, "-c", "print('a child row')"], check=True)
        harness.emit_summary("demo", {"x": 1}, args)
        out, err = capfd.readouterr()
        rows = ["a table row", "a child row"]
        if table_on_stdout:
            assert out.splitlines()[:2] == rows
        else:
            assert len(out.splitlines()) == 1 and err.splitlines() == rows
        assert json.loads(out.splitlines()[-1])["x"] == 1


def _benchmarks() -> list[Path]:
    return sorted(p for p in BENCHMARKS.glob("*.py") if p.stem not in NOT_BENCHMARKS)


def test_no_module_of_benchmarks_edits_the_import_path() -> None:
    offenders = [
        p.name
        for p in sorted(BENCHMARKS.rglob("*"))
        if p.is_file() and "sys.path" in p.read_text(errors="replace")
    ]
    assert offenders == []


@pytest.mark.parametrize("path", _benchmarks(), ids=lambda p: p.stem)
def test_every_benchmark_uses_the_harness(path: Path) -> None:
    tree = ast.parse(path.read_text())
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert {"add_common_options", "emit_summary"} <= called, path.name
    source = path.read_text()
    assert "json.dumps(summary" not in source and "statistics.median" not in source
    assert f"python -m benchmarks.{path.stem}" in (ast.get_docstring(tree) or ""), path.name

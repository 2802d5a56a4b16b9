"""The README's first command installs vcdl without its extras: nothing may need them.

CI installs ``.[dev]``, which also brings the ``postgres`` extra's psycopg: a
module-level ``import psycopg`` in the ledger broke ``vcdl train`` for
everyone who ran the README's first command on a fresh machine, and CI could
not see it. These tests run vcdl in a subprocess where every package only the
extras install cannot be imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# Import name of each distribution the extras add; a new one must be listed.
IMPORT_NAMES = {
    "pytest": "pytest",
    "pytest-timeout": "pytest_timeout",
    "pytest-xdist": "xdist",
    "hypothesis": "hypothesis",
    "ruff": "ruff",
    "mypy": "mypy",
    "moto": "moto",
    "psycopg": "psycopg",
    "selenium": "selenium",
}

# Installed in the subprocess before anything else: imports of these fail as
# they would where the package is not installed.
BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv.pop(1).split(","))
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def _dist_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def _extras_only() -> list[str]:
    core = {_dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = {
        _dist_name(r)
        for reqs in PYPROJECT["project"]["optional-dependencies"].values()
        for r in reqs
    }
    missing = sorted(extras - core - IMPORT_NAMES.keys())
    assert not missing, f"add the import names of {missing} to IMPORT_NAMES"
    return sorted(IMPORT_NAMES[d] for d in extras - core)


def _run_without_extras(
    code: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, ",".join(_extras_only()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=dict(os.environ) | (env or {}),
    )


def test_the_extras_hold_psycopg_and_the_test_tools() -> None:
    assert {"psycopg", "pytest", "moto"} <= set(_extras_only())


def test_every_module_imports_without_the_extras() -> None:
    code = """
import importlib, pkgutil
import vcdl, flows
for pkg in (vcdl, flows):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if ".migrations." in m.name:
            continue  # alembic's env and revisions: run by alembic, not imported
        importlib.import_module(m.name)
print("all imported", flush=True)
import psycopg  # the blocker works
"""
    out = _run_without_extras(code)
    assert "all imported" in out.stdout, out.stderr[-3000:]
    assert "No module named 'psycopg'" in out.stderr, out.stderr[-3000:]


def test_a_postgresql_ledger_without_psycopg_says_what_to_install(tmp_path: Path) -> None:
    code = """
from vcdl.errors import LedgerError
from vcdl.ledger import Ledger
try:
    Ledger("postgresql+psycopg://vcdl@127.0.0.1:5432/vcdl")
except LedgerError as exc:
    print(exc)
"""
    out = _run_without_extras(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "needs psycopg 3" in out.stdout and "[postgres]" in out.stdout, out.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("VCDL_README_TRAINED") == "1",
    reason="CI ran the README's first command itself, in a venv without the extras",
)
def test_the_readme_training_command_runs_without_the_extras(tmp_path: Path) -> None:
    """`vcdl train examples/mnist1d.toml`, shortened to one epoch, on an SQLite ledger."""
    code = """
import sys
from vcdl.cli import main
sys.exit(main())
"""
    home = tmp_path / "home"
    out = _run_without_extras(
        code,
        "train",
        str(REPO / "examples" / "mnist1d.toml"),
        "--set",
        "run.epochs=1",
        "--home",
        str(home),
        timeout=600,
        env={"PREFECT_HOME": str(tmp_path / "prefect"), "VCDL_HOME": str(home)},
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert (home / "ledger.db").is_file()
    assert "run mnist1d: completed" in text, text[-4000:]
    # The console shows the run, not Dask's routine (flows/cluster.py).
    routine = [line for line in text.splitlines() if "| INFO    | distributed." in line]
    assert routine == [], routine

"""A user module that exits when imported fails `vcdl train` with one line, never exit 0.

It ended `vcdl train` with exit 0, nothing trained and nothing said
(sys.exit(0) or os._exit(0) at the module's top level). Refused now before
anything is written: the home is not even made.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = """
[run]
name = "exits"
epochs = 1
[data]
name = "digits"
[model]
factory = "exits_here:model"
"""


@pytest.mark.parametrize("body", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"])
def test_vcdl_train_refuses_a_module_that_exits_at_import(tmp_path: Path, body: str) -> None:
    (tmp_path / "exits_here.py").write_text(body + "def model(**kw):\n    return None\n")
    (tmp_path / "run.toml").write_text(CONFIG)
    done = subprocess.run(
        [sys.executable, "-m", "vcdl.cli", "train", "run.toml", "--home", str(tmp_path / "h")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) <= 3 and "Traceback" not in done.stderr, done.stderr
    assert "exits_here" in lines[-1] and "while being imported" in lines[-1], lines
    # Nothing written: no run, and no built-in data set either (it was made first).
    assert not (tmp_path / "h").exists(), sorted(p.name for p in (tmp_path / "h").iterdir())

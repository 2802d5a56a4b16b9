"""Running ``vcdl`` in the test's own process against a home, capturing what it printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from vcdl.cli import main


def vcdl(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``vcdl ARGS --home HOME`` through :func:`vcdl.cli.main`: its exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as ended:
        main([*args, "--home", str(home)])
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err

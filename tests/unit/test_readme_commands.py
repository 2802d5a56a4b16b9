"""CI runs the README's two set-up commands verbatim: a change to one must reach the other."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)[:2]


def test_the_readme_starts_with_two_commands() -> None:
    first, second = _readme_commands()
    assert "-e . &&" in first and "vcdl train" in first  # installs no extras, trains
    assert "'.[dev]'" in second and "pytest" in second
    for command in (first, second):
        assert "\n" not in command
        # torch's CPU wheel first: any other spec pulls CUDA packages.
        assert command.index("torch==2.13.0") < command.index("-c constraints.txt")


def test_ci_runs_both_verbatim_first_without_the_extras() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    first, second = _readme_commands()
    assert first in ci and second in ci
    assert ci.index(first) < ci.index(second)

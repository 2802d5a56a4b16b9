"""The README's Python API example, saved as a script and run, trains once (issue 54, item 7).

It started nested runs: a LocalCluster's workers import the script again as
``__mp_main__``, and each started the run again (``LeaseHeld``, "Nanny failed
to start" tracebacks). The README's block, taken as it stands but for a
smaller run (1 epoch of 4,000 samples), runs as ``python script.py`` from the
repository's root with 2 workers: exit 0, one run completed, no worker
trouble on stderr. tests/unit/test_script_guard.py has the refusal of the
same call outside ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SMALLER = ('overrides=["run.epochs=3"]', 'overrides=["run.epochs=1", "data.samples=4000"]')


def readme_python_api_block() -> str:
    """The code block under the README's "Python API" heading."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"^### Python API\n.*?```python\n(.*?)```", text, re.S | re.M)
    assert found, "README.md has no ```python block under '### Python API'"
    return found.group(1)


def test_the_readme_example_guards_its_call() -> None:
    code = readme_python_api_block()
    assert 'if __name__ == "__main__":' in code
    assert SMALLER[0] in code, "the test shrinks the run by this text: update SMALLER"


@pytest.mark.slow
def test_the_readme_example_runs_as_a_script(tmp_path: Path, prefect_api_url: str) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_python_api_block().replace(*SMALLER))
    env = dict(
        os.environ,
        VCDL_HOME=str(tmp_path / "home"),
        PREFECT_API_URL=prefect_api_url,
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    err = done.stderr
    assert done.returncode == 0, err[-3000:]
    for trouble in ("Traceback", "LeaseHeld", "Nanny failed", "top level of the script"):
        assert trouble not in err, err[-3000:]
    # print(test accuracy, last history entry, state)
    assert done.stdout.strip().endswith("completed"), done.stdout
    from vcdl.ledger import Ledger

    with Ledger(f"sqlite:///{tmp_path / 'home' / 'ledger.db'}") as ledger:
        assert [r.name for r in ledger.list_runs()] == ["mnist1d-api"]

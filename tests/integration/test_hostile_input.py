"""Issue 34: no code from a config unless allowed, no planted secret stored or shown.

Through the CLI, as a user runs it: a model factory whose module would write
a marker file when imported, and a standard-library function that would run
a shell command, are refused before anything is imported (exit 2, one line
naming ``VCDL_ALLOW_IMPORTS``, nothing written); with the operator's
allowance the same module trains. A secret planted in a nested storage
option or in a URL's query is refused with one line that does not hold it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vcdl.cli import main

SECRET = "pl4nted-S3CRET-value"

CONFIG = """
[run]
epochs = 1
[data]
name = "digits"
shards = 2
[model]
factory = "{factory}"
{kwargs}
"""

MARKER_MODULE = """
import pathlib
import torch

pathlib.Path({marker!r}).write_text("imported")

def make(input_shape, num_classes):
    n = 1
    for d in input_shape:
        n *= d
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(n, num_classes))
"""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("vcdl: error: "), err
    return lines[0]


def _marker_job(tmp_path: Path, module: str) -> tuple[Path, Path, Path]:
    """(config, library directory, marker): the module is importable, not beside the config."""
    lib, conf = tmp_path / "lib", tmp_path / "conf"
    lib.mkdir()
    conf.mkdir()
    marker = tmp_path / "marker"
    (lib / f"{module}.py").write_text(MARKER_MODULE.format(marker=str(marker)))
    cfg = conf / "job.toml"
    cfg.write_text(CONFIG.format(factory=f"{module}:make", kwargs=""))
    return cfg, lib, marker


def test_a_factory_not_allowed_is_never_imported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, lib, marker = _marker_job(tmp_path, "vcdl_hostile_marker_a")
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    code, _, err = _run(["train", str(cfg), "--home", str(home)], capsys)
    assert code == 2, err
    line = _one_error_line(err)
    assert "VCDL_ALLOW_IMPORTS" in line and "vcdl_hostile_marker_a" in line
    assert "vcdl_hostile_marker_a" not in sys.modules
    assert not marker.exists() and not home.exists()


@pytest.mark.parametrize(
    ("factory", "kwargs"),
    [("os:system", "touch {marker}"), ("subprocess:getoutput", "touch {marker}")],
)
def test_a_shell_running_stdlib_function_is_refused(
    factory: str,
    kwargs: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    marker = tmp_path / "marker"
    argname = "command" if factory == "os:system" else "cmd"
    cfg = tmp_path / "job.toml"
    cfg.write_text(
        CONFIG.format(
            factory=factory, kwargs=f'kwargs = {{ {argname} = "{kwargs.format(marker=marker)}" }}'
        )
    )
    home = tmp_path / "home"
    code, _, err = _run(["train", str(cfg), "--home", str(home)], capsys)
    assert code == 2, err
    line = _one_error_line(err)
    assert "VCDL_ALLOW_IMPORTS" in line and f"module '{factory.split(':')[0]}'" in line
    assert not marker.exists() and not home.exists()


@pytest.mark.parametrize(
    "overrides",
    [
        [f'store.storage_options={{ client_kwargs = {{ aws_secret_access_key = "{SECRET}" }} }}'],
        [f"store.storage_options.config_kwargs.session_token={SECRET}"],
        [f'ledger.url="postgresql+psycopg://vcdl@127.0.0.1:1/vcdl?password={SECRET}"'],
        [f'ledger.url="postgresql+psycopg://vcdl:{SECRET}@127.0.0.1:1/vcdl"'],
        [f'store.url="s3://bucket/prefix?token={SECRET}"'],
    ],
    ids=["nested-option", "deeper-option", "query-password", "userinfo-password", "store-token"],
)
def test_a_planted_secret_is_refused_and_never_shown(
    overrides: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text(CONFIG.format(factory="cnn2d", kwargs=""))
    home = tmp_path / "home"
    argv = ["train", str(cfg), "--home", str(home)]
    for o in overrides:
        argv += ["--set", o]
    code, out, err = _run(argv, capsys)
    assert code == 2, err
    line = _one_error_line(err)
    assert "must not" in line and "credentials" in line
    assert SECRET not in out + err
    assert not home.exists()


@pytest.mark.slow
def test_with_the_allowance_the_factory_trains(tmp_path: Path, prefect_api_url: str) -> None:
    """The same refused module, allowed by the operator: imported, and the run completes."""
    cfg, lib, marker = _marker_job(tmp_path, "vcdl_hostile_marker_b")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def train(allow: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", str(home), "--json"],
            cwd=tmp_path,
            env=env
            | {
                "PYTHONPATH": os.pathsep.join([str(lib), str(Path(__file__).parents[2])]),
                "VCDL_ALLOW_IMPORTS": allow,
                "PREFECT_HOME": str(tmp_path / "prefect"),
                "PREFECT_API_URL": prefect_api_url,
            },
            capture_output=True,
            text=True,
            timeout=500,
        )

    refused = train("tests")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "VCDL_ALLOW_IMPORTS" in refused.stderr and not marker.exists()
    allowed = train("tests,vcdl_hostile_marker_b")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    summary = json.loads(allowed.stdout)
    assert summary["state"] == "completed" and summary["head_version"] == 2
    assert marker.read_text() == "imported"

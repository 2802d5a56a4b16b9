"""The user's own code reaches every worker: a model and an objective beside the config.

A temporary directory holds ``job.toml`` and the modules it names
(``mymodel:make``, which imports ``layers`` beside it, and ``myloss:loss``).
No ``PYTHONPATH``: the driver runs from another directory, and so do the
workers, on a LocalCluster (vcdl's own) and on a ``dask scheduler`` +
``dask worker`` cluster started by the test. A module that imports on the
driver but not on the workers fails the run once, with one line.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.cli_proc import kill_group
from tests.ports import free_port
from vcdl import api
from vcdl.errors import ModelError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent

LAYERS = """
import torch

def block(n_in: int, n_out: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(n_in, n_out), torch.nn.ReLU())
"""

MYMODEL = """
import os
import torch
from layers import block

if os.environ.get("JOB_REFUSE_WORKERS"):  # set on the test's dask workers only
    raise ImportError("no GPU driver on this worker (a test's stand-in)")

def make(input_shape, num_classes, hidden=32):
    n = 1
    for d in input_shape:
        n *= d
    head = torch.nn.Linear(hidden, num_classes)
    return torch.nn.Sequential(torch.nn.Flatten(), block(n, hidden), head)
"""

MYLOSS = """
import torch.nn.functional as F

def loss(model, batch):
    # The stored dtypes reach the user's objective: it casts for itself.
    return F.cross_entropy(model(batch["x"].float()), batch["y"].long())

def metrics(model, batch):
    hits = (model(batch["x"].float()).argmax(1) == batch["y"].long()).float().mean()
    return {"hit_rate": float(hits)}
"""


def write_job(root: Path, *, address: str | None = None, name: str = "job") -> Path:
    code = root / "code"
    code.mkdir(parents=True)
    (code / "layers.py").write_text(LAYERS)
    (code / "mymodel.py").write_text(MYMODEL)
    (code / "myloss.py").write_text(MYLOSS)
    cluster = f'address = "{address}"\n' if address else "workers = 2\n"
    cfg = code / "job.toml"
    cfg.write_text(
        f'[run]\nname = "{name}"\nepochs = 2\n'
        '[data]\nname = "mnist1d"\nsamples = 2000\nshards = 4\n'
        '[model]\nfactory = "mymodel:make"\nkwargs = { hidden = 16 }\n'
        '[train]\nobjective = "myloss:loss"\nmetrics = "myloss:metrics"\nlr = 0.01\n'
        f"[cluster]\n{cluster}"
    )
    return cfg


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | extra


def test_a_local_cluster_run_imports_the_modules_beside_its_config(
    tmp_path: Path, prefect_api_url: str
) -> None:
    cfg = write_job(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", str(home), "--json"],
        cwd=elsewhere,
        env=clean_env(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=prefect_api_url),
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    summary = json.loads(proc.stdout)
    assert summary["state"] == "completed" and summary["head_version"] == 8
    assert set(summary["test_metrics"]) == {"loss", "hit_rate"}
    assert summary["test_accuracy"] is None  # a custom objective names its own metrics


@contextlib.contextmanager
def dask_cluster(tmp_path: Path, **worker_env: str) -> Iterator[str]:
    """A ``dask scheduler`` and two ``dask worker`` processes, started in another directory."""
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    cwd = tmp_path / "cluster"
    cwd.mkdir()
    env = clean_env(PREFECT_API_URL=str(PREFECT_API_URL.value()), **worker_env)
    procs = []
    logs = []
    try:
        for name, args in [
            (
                "scheduler",
                ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            ),
            ("w1", ["worker", address, "--nthreads", "2", "--local-directory", str(cwd / "w1")]),
            ("w2", ["worker", address, "--nthreads", "2", "--local-directory", str(cwd / "w2")]),
        ]:
            log = open(cwd / f"{name}.log", "wb")  # noqa: SIM115  (closed below)
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [str(BIN / "dask"), *args],
                    cwd=cwd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        from distributed import Client

        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(address, timeout=5) as client:
                    client.wait_for_workers(2, timeout=60)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield address
    finally:
        for p in procs:
            kill_group(p.pid)
            p.wait(30)
        for log in logs:
            log.close()


def test_a_cluster_given_by_address_gets_the_modules_too(
    prefect_api: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with dask_cluster(tmp_path) as address:
        cfg = write_job(tmp_path, address=address, name="job-remote")
        monkeypatch.chdir(tmp_path)  # not the code's directory
        summary = api.train(cfg, home=tmp_path / "home")
    assert summary["state"] == "completed" and summary["head_version"] == 8
    assert summary["test_metrics"]["hit_rate"] > 0.15


def test_a_module_that_fails_on_the_workers_fails_the_run_once(
    prefect_api: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with dask_cluster(tmp_path, JOB_REFUSE_WORKERS="1") as address:
        cfg = write_job(tmp_path, address=address, name="job-refused")
        monkeypatch.chdir(tmp_path)
        with pytest.raises(ModelError) as info:
            api.train(cfg, home=tmp_path / "home")
    message = str(info.value)
    assert "\n" not in message
    assert "do not import on the Dask workers" in message
    assert "no GPU driver on this worker" in message
    # Nothing was trained: the run failed before its first attempt.
    from vcdl.runtime import existing_ledger

    assert existing_ledger(tmp_path / "home").attempts("job-refused") == []

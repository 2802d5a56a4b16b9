"""The time-to-accuracy benchmark's contenders, each run to a timed accuracy curve.

One plain PyTorch process (fault-free only), 2-process DDP under
``torchrun`` (its ranks SIGKILLed on the schedule in part b, restarted by
``--max-restarts`` from their last checkpoint) and vcdl on the LocalCluster
it starts for a run (its Dask worker processes SIGKILLed on the same
schedule). The method is described in ``benchmarks/time_to_accuracy.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.tta_common import accuracies, seeded_model, snapshot
from vcdl.chaos import ChaosEvent, ScheduledKiller, dask_worker_pids
from vcdl.config import RunConfig
from vcdl.worker.loop import make_optimizer

DDP_SCRIPT = Path(__file__).resolve().parent / "ddp_train.py"


def _kills(killer: ScheduledKiller | None) -> dict[str, Any]:
    if killer is None:
        return {"kills": 0, "skipped": 0, "kill_times": []}
    sent = [r.at for r in killer.records if r.outcome == "sent"]
    return {"kills": len(sent), "skipped": len(killer.records) - len(sent), "kill_times": sent}


# --------------------------------------------------------------------------
# Contender 1: one plain PyTorch process (fault-free only)
# --------------------------------------------------------------------------


def run_one_process(cfg: RunConfig, npz: Path, snapshots_per_epoch: int) -> dict[str, Any]:
    """Plain training in this process; weights copied to memory ``snapshots_per_epoch`` times."""
    torch.set_num_threads(1)
    with np.load(npz, allow_pickle=False) as d:
        xs, ys = torch.from_numpy(d["x_train"]), torch.from_numpy(d["y_train"])
    model = seeded_model(cfg)
    opt = make_optimizer(list(model.parameters()), cfg.train)
    gen = torch.Generator().manual_seed(cfg.run.seed)
    bs = cfg.train.batch_size
    steps = -(-len(xs) // bs)
    every = max(1, steps // snapshots_per_epoch)
    snaps: list[tuple[float, dict[str, torch.Tensor]]] = []
    t0 = time.time()
    for _ in range(cfg.run.epochs):
        model.train()
        order = torch.randperm(len(xs), generator=gen)
        for step, i in enumerate(range(0, len(xs), bs)):
            idx = order[i : i + bs]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xs[idx]), ys[idx]).backward()
            opt.step()
            if (step + 1) % every == 0:
                snaps.append((time.time() - t0, {k: v.clone() for k, v in snapshot(model)}))
    wall = time.time() - t0
    curve = accuracies(cfg, npz, [(t, _const(state)) for t, state in snaps])
    return {"curve": curve, "train_wall": round(wall, 2), "total_wall": round(wall, 2)}


def _const(state: dict[str, torch.Tensor]) -> Callable[[], Mapping[str, Any]]:
    return lambda: state


# --------------------------------------------------------------------------
# Contender 2: DDP under torchrun
# --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            out.append(json.loads(line))
    return out


def _ranks(agent_pid: int) -> dict[str, int]:
    """The training processes under a torchrun agent (not the agent itself)."""
    import psutil

    out = {}
    for child in psutil.Process(agent_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = child.cmdline()
            if any(a.endswith("ddp_train.py") for a in cmd) and "torch.distributed.run" not in cmd:
                out[f"rank-pid-{child.pid}"] = child.pid
    # Labels by position (oldest first): the same seeded choice picks the same slot.
    return {f"rank{i}": pid for i, pid in enumerate(sorted(out.values()))}


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a torchrun agent and its ranks (a no-op after a clean exit).

    The ranks run in sessions of their own, and killing the agent alone
    orphans them, still training: find them first, then kill everything.
    """
    import psutil

    with contextlib.suppress(psutil.Error):
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
    proc.wait()


def run_ddp(
    cfg: RunConfig,
    npz: Path,
    out: Path,
    *,
    checkpoint: bool,
    events: list[ChaosEvent],
    seed: int,
    snapshots_per_epoch: int,
    timeout: float = 1800.0,
    env_extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``torchrun`` 2-process DDP; with ``events``, its ranks are SIGKILLed on schedule.

    ``env_extra`` is added to the agent's (and so the ranks') environment,
    e.g. glibc's thresholds as vcdl's workers set them
    (``vcdl.worker.allocator.TUNED_ENV``).
    """
    out.mkdir(parents=True, exist_ok=True)
    config = out / "run.json"
    config.write_text(cfg.model_dump_json())
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", "2",
        "--max-restarts", str(100 if events else 0),
        "--monitor-interval", "0.1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
        str(DDP_SCRIPT), "--config", str(config), "--data", str(npz), "--out", str(out),
        "--snapshots", str(snapshots_per_epoch),
        # A new prefix per launch: a FileStore left by an earlier run in this
        # directory must never be read (ddp_train.py).
        "--pg-store", str(out / f"pg-store-{uuid.uuid4().hex[:12]}"),
    ]  # fmt: skip
    if checkpoint:
        cmd.append("--checkpoint")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env_extra or {})}
    log = out / "torchrun.log"
    started = time.time()
    with log.open("wb") as logf:
        agent = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        killer = None
        if events:
            killer = ScheduledKiller(
                events,
                lambda: _ranks(agent.pid),
                seed=seed,
                min_victims=2,
                log_path=out / "kills.jsonl",
            )
            killer.start()
        try:
            ev_path = out / "events.jsonl"
            while agent.poll() is None:
                if killer is not None and killer.t0 is None:
                    t0 = next((e["time"] for e in _events(ev_path) if e["event"] == "t0"), None)
                    if t0 is not None:
                        killer.start_clock(t0)
                if time.time() - started > timeout:
                    raise TimeoutError(f"torchrun ran past {timeout:.0f}s; see {log}")
                time.sleep(0.05)
        finally:
            if killer is not None:
                killer.stop()
            _kill_tree(agent)
    total = time.time() - started
    if agent.returncode != 0:
        raise RuntimeError(f"torchrun exited {agent.returncode}:\n{log.read_text()[-3000:]}")
    evs = _events(out / "events.jsonl")
    t0 = next(e["time"] for e in evs if e["event"] == "t0")
    done = next(e["time"] for e in evs if e["event"] == "done")
    starts = [e for e in evs if e["event"] == "start"]
    if checkpoint:
        ckpts = [e for e in evs if e["event"] == "checkpoint"]
        states = [
            (e["time"] - t0, lambda p=e["path"]: torch.load(p, weights_only=True)["model"])
            for e in ckpts
        ]
    else:
        snaps = torch.load(out / "snapshots.pt", weights_only=True)
        states = [
            (t - t0, lambda s=s: s) for t, s in zip(snaps["times"], snaps["states"], strict=True)
        ]
    return {
        "curve": accuracies(cfg, npz, states),
        "train_wall": round(done - t0, 2),
        "total_wall": round(total, 2),
        "restarts": len(starts) - 1,
        "malloc_env": starts[0].get("malloc_env", {}) if starts else {},
        "resumed_from_checkpoint": sum(1 for e in starts if e.get("resumed_epoch") is not None),
        "checkpoint_write_seconds": round(
            sum(e.get("write_seconds", 0.0) for e in evs if e["event"] == "checkpoint"), 2
        ),
        **_kills(killer),
    }


# --------------------------------------------------------------------------
# Contender 3: vcdl
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _first_submit_mark(on_first: Callable[[float], None]) -> Iterator[list[float]]:
    """Mark the driver's first shard submission, without changing flows/."""
    from flows.epoch import EpochExecutor

    original = EpochExecutor.submit
    marks: list[float] = []

    def submit(self: EpochExecutor, key: tuple[int, int], number: int, base: int | None) -> None:
        if not marks:
            marks.append(time.time())
            on_first(marks[0])
        original(self, key, number, base)

    EpochExecutor.submit = submit  # type: ignore[method-assign]
    try:
        yield marks
    finally:
        EpochExecutor.submit = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _vcdl_scheduler() -> Iterator[Callable[[], Any]]:
    """A Dask client of the LocalCluster vcdl starts for the run, while it is up.

    vcdl's own cluster (flows/cluster.py: a spare thread per worker, warm-up
    plugin, watchdog) is what users get, so the benchmark runs on it instead
    of one of its own; its scheduler address is caught where flows/train.py
    enters it (after the workers are warm), without changing flows/. The
    client is made on first use (the kill schedule's first event) and closed
    before the cluster is: a client left open reconnects to the closed
    scheduler and logs ConnectionRefused tracebacks after every run.
    """
    from distributed import Client

    import flows.train as ft

    original = ft.dask_cluster
    lock = threading.Lock()  # the kill thread makes the client; the driver closes it
    address: str | None = None  # of the cluster while it is up
    held: Client | None = None

    def close_client() -> None:
        nonlocal address, held
        with lock:
            address = None
            if held is not None:
                with contextlib.suppress(Exception):
                    held.close()
                held = None

    @contextlib.contextmanager
    def cluster(cfg: RunConfig) -> Iterator[str]:
        nonlocal address
        with original(cfg) as up:
            with lock:
                address = up
            try:
                yield up
            finally:
                close_client()

    def client() -> Client:
        nonlocal held
        with lock:
            if address is None:
                raise RuntimeError("no vcdl cluster up")
            if held is None:
                # Not the default client: vcdl's driver must not lean on it.
                held = Client(address, timeout=30, set_as_default=False)
            return held

    ft.dask_cluster = cluster
    try:
        yield client
    finally:
        ft.dask_cluster = original
        close_client()


def run_vcdl(
    cfg: RunConfig, npz: Path, home: Path, *, events: list[ChaosEvent], seed: int
) -> dict[str, Any]:
    """A vcdl run on its own LocalCluster; with ``events``, its worker processes are SIGKILLed."""
    from vcdl import api
    from vcdl.data import import_npz
    from vcdl.driver.runs import load_version
    from vcdl.runtime import RunRef, open_store
    from vcdl.views.cost import cost_report
    from vcdl.views.goodput import salvaged_attempts, salvaged_seconds, useful_training_seconds

    # Every version is evaluated afterwards for the curve: none may be pruned.
    cfg = cfg.with_locations(home).updated(store={"keep": {"all": True}})
    assert cfg.store.url is not None
    import_npz(open_store(cfg.store.url), npz, cfg.data.name, num_classes=10)
    started = time.time()
    killer: ScheduledKiller | None = None
    with _vcdl_scheduler() as client:
        if events:
            killer = ScheduledKiller(
                events,
                lambda: dask_worker_pids(client()),
                seed=seed,
                min_victims=cfg.cluster.workers,
                log_path=home / "kills.jsonl",
            )
            killer.start()
        mark = killer.start_clock if killer is not None else (lambda t: None)
        try:
            with _first_submit_mark(mark) as marks:
                summary = api.train(cfg, home=home)
        finally:
            if killer is not None:
                killer.stop()
    total = time.time() - started
    ref = RunRef.from_config(cfg)
    ledger = ref.ledger()
    versions = [v for v in ledger.versions(ref.run) if v.number > 0]
    attempts = ledger.attempts(ref.run)
    if marks:
        t0, t0_source = marks[0], "driver's first submission"
    else:  # the hook did not fire (flows changed): the first claim, slightly later
        t0 = min(a.started_at for a in attempts).timestamp()
        t0_source = "earliest attempt started_at (approximation)"
    last_merge = max(v.created_at.timestamp() for v in versions)
    # Training that reached a version: merged attempts', and the checkpointed
    # part of killed attempts a merged one resumed.
    salvaged = salvaged_attempts(attempts)
    useful = [a for a in attempts if a.state == "merged" or a.id in salvaged]
    recorded = [useful_training_seconds(a, salvaged) for a in useful if a.train_seconds is not None]
    states = [
        (v.created_at.timestamp() - t0, lambda n=v.number: load_version(ref, n)[1])
        for v in versions
    ]
    cost = cost_report(ledger, ref.run)
    return {
        "curve": accuracies(cfg, npz, states),
        "train_wall": round(last_merge - t0, 2),
        "total_wall": round(total, 2),
        "t0": t0_source,
        "final_accuracy_reported": summary["test_accuracy"],
        "attempts": len(attempts),
        "attempts_with_train_seconds": len(recorded),
        "resumed": sum(1 for a in attempts if a.resumed_from),
        "salvaged_seconds": round(salvaged_seconds(attempts, salvaged), 2),
        "attempt_states": {
            s: sum(a.state == s for a in attempts) for s in {a.state for a in attempts}
        },
        "utilization": round(sum(recorded) / (cfg.cluster.workers * (last_merge - t0)), 4),
        "spot_discount": cost["spot_discount"],
        "realized_savings": cost["realized_savings"],
        "savings_gap_points": cost["savings_gap_points"],
        **_kills(killer),
    }

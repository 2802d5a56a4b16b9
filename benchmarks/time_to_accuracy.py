"""Time to accuracy: vcdl vs one PyTorch process vs DDP, fault-free and under kills.

Part (a), fault-free, ``cnn1d`` width 64: wall seconds from time zero to 95%
and 97% test accuracy for vcdl (2 Dask workers, 8 shards), one plain PyTorch
process and DistributedDataParallel (gloo, 2 processes under ``torchrun``).
Part (b), a seeded kill schedule (a Poisson process, one SIGKILL every
``--kill-interval`` seconds on average, the same kill times after time zero
for both contenders), ``cnn1d`` width 256: wall seconds to 98% and the
accuracy after the last epoch for vcdl and for ``torchrun --max-restarts``
DDP that checkpoints every epoch.

Method (the same for every contender):

* Data: vcdl's built-in MNIST-1D, generated once into ``--cache-dir`` as an
  ``.npz``; vcdl imports it into each run's store, the plain contenders read
  the arrays: every contender trains and is tested on the same samples.
* Model and optimizer: ``vcdl.models.cnn1d`` seeded as vcdl seeds it, Adam
  3e-3 (examples/mnist1d.toml), one torch thread per process.
* Batch: the same *global* batch for every contender, the samples the
  whole fleet consumes per optimizer step: vcdl's ``train.batch_size`` is
  per worker (50 in examples/mnist1d.toml, 2 workers: 100 in all); one
  process steps on 100; DDP splits 100 over its 2 ranks (50 each, their
  gradients averaged, as vcdl's merge averages its workers' changes).
  Every training process of a 2-process contender steps on 50 samples.
* Time zero = the first hand-out of training work after every process is up:
  vcdl, the driver's first shard submission (marked in the driver by
  wrapping ``flows.epoch.EpochDriver.submit``; vcdl runs on the LocalCluster
  it starts for every run, as a user gets it, whose workers have imported
  torch/vcdl/prefect before it, as DDP's ranks have); one
  process and DDP, rank 0's first training step (after import, process-group
  set-up and data loading). Start-up before time zero is not counted for
  anyone; each contender's total wall time including start-up is printed too.
* Accuracy over time = durable model states with a time stamp, evaluated on
  the test split afterwards (untimed). vcdl: every version in the ledger
  (``created_at``). Fault-free one process and DDP: a copy of the weights
  kept in memory as often as vcdl makes versions (``shards`` per epoch).
  Under kills only what survives counts: DDP's per-epoch checkpoints on disk
  (their write time included: it is their fault-tolerance cost) and vcdl's
  versions. "Time to X%" is the first durable state at or above X.
* Kills: SIGKILL of one training process — a Dask worker process (not its
  nanny, which restarts it) or one of torchrun's two ranks (the agent
  restarts the group, which resumes from the last checkpoint). An event fires
  only while both of the contender's training processes are up, else it is
  recorded as skipped (a machine already down cannot be taken again); the
  victim is a seeded choice, the same sequence for both.
* Utilization (vcdl, part b) = Σ ``train_seconds`` of the training that
  reached a version ÷ (workers × seconds from time zero to the last merge):
  merged attempts', and the part of killed attempts kept in a checkpoint that
  a merged attempt resumed (vcdl checkpoints every
  ``checkpoint_seconds_b`` of training in part b). Training lost to a kill
  after the last checkpoint does not count.
* Savings: ``vcdl.cost.cost_report`` on the part (b) vcdl run.
* Contenders run one after another in each repeat (vcdl, any ``--vcdl-also``
  variants of it, one process in part a, DDP);
  figures are medians over ``--repeats``. The machine is shared: timings
  are noisy.

    python benchmarks/time_to_accuracy.py            # full: ~12 min
    python benchmarks/time_to_accuracy.py --quick    # small sizes, ~3 min (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vcdl.chaos import ChaosEvent, ScheduledKiller, chaos_schedule, dask_worker_pids
from vcdl.config import RunConfig, load_config
from vcdl.models import build_model
from vcdl.train import evaluate, make_optimizer

REPO = Path(__file__).resolve().parent.parent
DDP_SCRIPT = Path(__file__).resolve().parent / "ddp_train.py"
Curve = list[tuple[float, float]]  # (seconds after time zero, test accuracy)


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run (``--quick`` shrinks them)."""

    samples: int = 40_000
    shards: int = 8
    workers: int = 2
    width_a: int = 64
    epochs_a: int = 8
    targets_a: tuple[float, ...] = (0.95, 0.97)
    width_b: int = 256
    epochs_b: int = 10
    target_b: float = 0.98
    kill_interval: float = 15.0
    kill_seed: int = 6
    kill_start_after: float = 0.0
    kill_duration: float = 3600.0  # kills only within this many seconds after the start
    repeats_a: int = 3
    repeats_b: int = 1
    # vcdl's fault.checkpoint_seconds in part (b): a kill loses the training
    # since the attempt's last checkpoint (DDP's: since its last epoch).
    checkpoint_seconds_b: float = 1.0
    # Config overrides (section.key=value) of part (a), for every contender.
    overrides_a: tuple[str, ...] = ()
    # More vcdl contenders, side by side with the shipped one in each part:
    # each a comma-separated list of overrides (e.g. "merge.rule=delta").
    variants: tuple[str, ...] = ()
    # Weight copies per epoch of the fault-free one process and DDP: at least
    # as often as vcdl makes versions, so their time-to is never the coarser.
    snapshots: int = 8
    config: str = str(REPO / "examples" / "mnist1d.toml")
    cache_dir: str = str(Path(tempfile.gettempdir()) / "vcdl-tta-cache")
    parts: tuple[str, ...] = ("a", "b")


QUICK = Settings(
    samples=8_000,
    width_a=32,
    epochs_a=3,
    targets_a=(0.6, 0.7),
    width_b=64,
    epochs_b=6,
    target_b=0.8,
    # Seed 7: kills at 2.09 s and 3.67 s only. The quick DDP run trains ~0.5 s
    # per epoch (6 epochs, ~3 s): the first kill lands after its first
    # checkpoints, whatever the speed of the machine within 4x; later kills
    # could outlast it (a CI run once had none land with kills from 6.3 s).
    kill_interval=1.5,
    kill_seed=7,
    kill_start_after=1.5,
    kill_duration=2.5,
    repeats_a=1,
    repeats_b=1,
)


# --------------------------------------------------------------------------
# Data, configs, evaluation
# --------------------------------------------------------------------------


def cached_data(cache_dir: str | Path, samples: int) -> Path:
    """MNIST-1D as vcdl generates it, written once to ``cache_dir`` as an ``.npz``."""
    path = Path(cache_dir) / f"mnist1d-{samples}.npz"
    if path.exists():
        return path
    from vcdl.data import make_mnist1d, read_rows
    from vcdl.store import WeightStore

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vcdl-tta-gen-") as tmp:
        store = WeightStore(tmp)
        make_mnist1d(store, samples=samples)
        x, y = read_rows(store, "mnist1d", "train")
        xt, yt = read_rows(store, "mnist1d", "test")
    tmp_path = path.with_suffix(".tmp.npz")
    np.savez(tmp_path, x_train=x, y_train=y, x_test=xt, y_test=yt)
    os.replace(tmp_path, path)
    return path


def run_config(
    s: Settings, width: int, epochs: int, name: str, overrides: Sequence[str] = ()
) -> RunConfig:
    """examples/mnist1d.toml with this benchmark's sizes, then ``overrides``."""
    return load_config(
        s.config,
        [
            f"run.name={name}",
            f"run.epochs={epochs}",
            f"data.samples={s.samples}",
            f"data.shards={s.shards}",
            f"cluster.workers={s.workers}",
            "model.factory=cnn1d",
            f"model.kwargs.width={width}",
            *overrides,
        ],
    )


def _model(cfg: RunConfig) -> torch.nn.Module:
    torch.manual_seed(cfg.run.seed)  # as vcdl.runs.new_model
    return build_model(cfg.model.factory, cfg.model.kwargs, input_shape=(40,), num_classes=10)


def _test_split(npz: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(npz, allow_pickle=False) as d:
        return d["x_test"], d["y_test"]


def accuracies(
    cfg: RunConfig, npz: Path, states: Sequence[tuple[float, Callable[[], Mapping[str, Any]]]]
) -> Curve:
    """Test accuracy of each timed state (loaded lazily, one at a time), untimed."""
    xt, yt = _test_split(npz)
    model = _model(cfg)
    out = []
    for t, load in states:
        acc, _ = evaluate(model, dict(load()), xt, yt, cfg.data.eval_batch_size)
        out.append((round(t, 2), acc))
    return out


def time_to(curve: Curve, target: float) -> float | None:
    """Seconds to the first durable state at or above ``target``; None if never."""
    return next((t for t, acc in curve if acc >= target), None)


def kill_schedule(s: Settings) -> list[ChaosEvent]:
    """The seeded kill times (seconds after time zero) every contender of part (b) gets."""
    return chaos_schedule(
        1.0 / s.kill_interval,
        s.kill_duration,
        s.kill_seed,
        notice_fraction=0.0,
        start_after=s.kill_start_after,
    )


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
    model = _model(cfg)
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


def snapshot(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(k, v.detach()) for k, v in model.state_dict().items()]


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
) -> dict[str, Any]:
    """``torchrun`` 2-process DDP; with ``events``, its ranks are SIGKILLed on schedule."""
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
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
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
    from flows.epoch import EpochDriver

    original = EpochDriver.submit
    marks: list[float] = []

    def submit(self: EpochDriver, key: tuple[int, int]) -> None:
        if not marks:
            marks.append(time.time())
            on_first(marks[0])
        original(self, key)

    EpochDriver.submit = submit  # type: ignore[method-assign]
    try:
        yield marks
    finally:
        EpochDriver.submit = original  # type: ignore[method-assign]


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
                held = Client(address, timeout=30)
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
    from vcdl.cost import (
        cost_report,
        salvaged_attempts,
        salvaged_seconds,
        useful_training_seconds,
    )
    from vcdl.data import import_npz
    from vcdl.runs import load_version
    from vcdl.runtime import RunRef, open_store

    cfg = cfg.with_locations(home)
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


# --------------------------------------------------------------------------
# The two parts
# --------------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    """Median; a contender that never reached the target counts as infinitely slow."""
    vals = [float("inf") if v is None else v for v in values]
    m = statistics.median(vals) if vals else float("inf")
    return None if m == float("inf") else round(m, 2)


def _final(curve: Curve) -> float:
    return curve[-1][1] if curve else 0.0


def contenders(
    s: Settings, width: int, epochs: int, name: str, overrides: Sequence[str]
) -> tuple[RunConfig, dict[str, RunConfig]]:
    """The plain contenders' config, then vcdl's: "vcdl" and "vcdl <overrides>" per variant.

    vcdl's ``train.batch_size`` is per worker; the plain config's is the
    global batch, the workers' batches together (one process steps on it,
    DDP splits it over its ranks).
    """
    shipped = run_config(s, width, epochs, name, overrides)
    plain = shipped.updated(train={"batch_size": shipped.global_batch_size})
    return plain, {
        "vcdl": shipped,
        **{
            f"vcdl {v}": run_config(s, width, epochs, name, [*overrides, *v.split(",")])
            for v in s.variants
        },
    }


def part_a(s: Settings, npz: Path, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Fault-free time to the part (a) targets, medians over ``repeats_a``."""
    cfg, vcdls = contenders(s, s.width_a, s.epochs_a, "tta-a", s.overrides_a)
    snapshots = max(s.snapshots, cfg.data.shards)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in vcdls}
    runs |= {"one_process": [], "ddp": []}
    for i in range(s.repeats_a):
        for j, (name, vcfg) in enumerate(vcdls.items()):
            runs[name].append(
                run_vcdl(vcfg, npz, work / f"a{i}-vcdl{j or ''}", events=[], seed=s.kill_seed)
            )
        runs["one_process"].append(run_one_process(cfg, npz, snapshots))
        runs["ddp"].append(
            run_ddp(
                cfg,
                npz,
                work / f"a{i}-ddp",
                checkpoint=False,
                events=[],
                seed=s.kill_seed,
                snapshots_per_epoch=snapshots,
            )
        )
        for name, r in runs.items():
            log(f"(a) run {i + 1}/{s.repeats_a} {name}: {_brief(r[-1], s.targets_a)}")
    out: dict[str, Any] = {
        "width": s.width_a,
        "epochs": s.epochs_a,
        "repeats": s.repeats_a,
        "shards": cfg.data.shards,
        "lr": cfg.train.lr,
        "global_batch": cfg.train.batch_size,
        "worker_batch": vcdls["vcdl"].train.batch_size,
        "alpha": cfg.merge.alpha,
        "overrides": list(s.overrides_a),
        "variants": list(s.variants),
    }
    for name, rs in runs.items():
        out[name] = {
            **{
                f"time_to_{_pct(t)}": _median([time_to(r["curve"], t) for r in rs])
                for t in s.targets_a
            },
            "final_accuracy": statistics.median(_final(r["curve"]) for r in rs),
            "train_wall": _median([r["train_wall"] for r in rs]),
            "total_wall": _median([r["total_wall"] for r in rs]),
            "runs": rs,
        }
    return out


def part_b(s: Settings, npz: Path, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Time to ``target_b`` and final accuracy under the kill schedule."""
    cfg, vcdls = contenders(
        s, s.width_b, s.epochs_b, "tta-b", [f"fault.checkpoint_seconds={s.checkpoint_seconds_b}"]
    )
    events = kill_schedule(s)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in [*vcdls, "ddp"]}
    for i in range(s.repeats_b):
        for j, (name, vcfg) in enumerate(vcdls.items()):
            runs[name].append(
                run_vcdl(vcfg, npz, work / f"b{i}-vcdl{j or ''}", events=events, seed=s.kill_seed)
            )
        runs["ddp"].append(
            run_ddp(
                cfg,
                npz,
                work / f"b{i}-ddp",
                checkpoint=True,
                events=events,
                seed=s.kill_seed,
                snapshots_per_epoch=s.shards,
            )
        )
        for name, r in runs.items():
            log(f"(b) run {i + 1}/{s.repeats_b} {name}: {_brief(r[-1], (s.target_b,))}")
    out: dict[str, Any] = {
        "width": s.width_b,
        "epochs": s.epochs_b,
        "repeats": s.repeats_b,
        "kill_interval": s.kill_interval,
        "kill_seed": s.kill_seed,
        "global_batch": cfg.train.batch_size,
        "worker_batch": vcdls["vcdl"].train.batch_size,
        "schedule_first_10": [e.at for e in events[:10]],
        "variants": list(s.variants),
    }
    for name, rs in runs.items():
        out[name] = {
            f"time_to_{_pct(s.target_b)}": _median([time_to(r["curve"], s.target_b) for r in rs]),
            "final_accuracy": statistics.median(_final(r["curve"]) for r in rs),
            "train_wall": _median([r["train_wall"] for r in rs]),
            "total_wall": _median([r["total_wall"] for r in rs]),
            "kills": statistics.median(r["kills"] for r in rs),
            "runs": rs,
        }
        if name != "ddp":
            out[name] |= _vcdl_medians(rs)
    out["ddp"]["resumed_from_checkpoint"] = sum(r["resumed_from_checkpoint"] for r in runs["ddp"])
    return out


def _vcdl_medians(v: list[dict[str, Any]]) -> dict[str, Any]:
    """Utilization and savings of vcdl runs under kills, medians."""
    gaps = [r["savings_gap_points"] for r in v if r["savings_gap_points"] is not None]
    realized = [r["realized_savings"] for r in v if r["realized_savings"] is not None]
    return {
        "utilization": statistics.median(r["utilization"] for r in v),
        "savings_gap_points": statistics.median(gaps) if gaps else None,
        "spot_discount": v[0]["spot_discount"],
        "realized_savings": statistics.median(realized) if realized else None,
    }


def _pct(target: float) -> str:
    return f"{round(100 * target)}"


def _fmt(x: float | None, unit: str = "s") -> str:
    return "never" if x is None else f"{x:.1f}{unit}"


def _brief(r: dict[str, Any], targets: Sequence[float]) -> str:
    hits = ", ".join(f"{_pct(t)}% at {_fmt(time_to(r['curve'], t))}" for t in targets)
    extra = f", {r['kills']} kills" if r.get("kills") else ""
    return f"{hits}, final {_final(r['curve']):.4f}, train wall {r['train_wall']:.1f}s{extra}"


def verdicts(res: dict[str, Any], s: Settings) -> list[tuple[str, bool | None, str]]:
    """The targets of issue 6: (name, PASS/MISS/None = no verdict here, figures)."""
    out: list[tuple[str, bool | None, str]] = []
    if "a" in res:
        a, key = res["a"], f"time_to_{_pct(s.targets_a[0])}"
        vc, ddp = a["vcdl"][key], a["ddp"][key]
        ok = vc is not None and (ddp is None or vc <= ddp)
        out.append((f"(a) vcdl time to {key[8:]}% <= DDP's", ok, f"{_fmt(vc)} vs {_fmt(ddp)}"))
    if "b" in res:
        b, key = res["b"], f"time_to_{_pct(s.target_b)}"
        vc, ddp = b["vcdl"][key], b["ddp"][key]
        ok = vc is not None and (ddp is None or vc <= ddp / 2)
        out.append(
            (f"(b) vcdl time to {key[8:]}% <= half of torchrun's", ok, f"{_fmt(vc)} vs {_fmt(ddp)}")
        )
        u = b["vcdl"]["utilization"]
        # Reported, not judged: part (b)'s attempts train ~2 s, where the fixed
        # cost per attempt weighs more; issue 6 sets 85 % for ~5-s attempts,
        # and overhead.py --kill-every 15 measures that.
        out.append(
            (
                "(b) vcdl utilization (~2-s attempts; the 85% target is overhead.py's)",
                None,
                f"{100 * u:.1f}% (merged + salvaged training)",
            )
        )
        g = b["vcdl"]["savings_gap_points"]
        out.append(
            (
                "(b) realized savings within 5 points of the spot discount",
                None if g is None else g <= 5.0,
                "n/a"
                if g is None
                else f"gap {g:.2f} points "
                f"(discount {100 * b['vcdl']['spot_discount']:.1f}%, "
                f"realized {100 * b['vcdl']['realized_savings']:.1f}%)",
            )
        )
    return out


def run_benchmark(
    s: Settings, work: Path | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the parts of ``s``; return every figure (curves, medians, verdicts)."""
    from vcdl.api import prepare_prefect

    npz = cached_data(s.cache_dir, s.samples)
    # Prefect's state stays with the cache (one warm ephemeral server for all runs).
    prepare_prefect(Path(s.cache_dir))
    res: dict[str, Any] = {"benchmark": "time_to_accuracy", "settings": asdict(s), "data": str(npz)}
    with contextlib.ExitStack() as stack:
        if work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vcdl-tta-")))
        if "a" in s.parts:
            res["a"] = part_a(s, npz, work, log)
        if "b" in s.parts:
            res["b"] = part_b(s, npz, work, log)
    res["verdicts"] = [
        {"target": n, "result": None if ok is None else ("PASS" if ok else "MISS"), "figures": f}
        for n, ok, f in verdicts(res, s)
    ]
    return res


def print_report(res: dict[str, Any], s: Settings) -> None:
    if "a" in res:
        a = res["a"]
        keys = [f"time_to_{_pct(t)}" for t in s.targets_a]
        print(
            f"\n(a) fault-free, cnn1d width {a['width']}, {a['epochs']} epochs, global batch "
            f"{a['global_batch']} (vcdl: {a['worker_batch']} per worker), "
            f"medians of {a['repeats']} (seconds from time zero):"
        )
        head = "".join(f"{'to ' + k[8:] + '%':>10}" for k in keys)
        names = ["vcdl", *(f"vcdl {v}" for v in a.get("variants", [])), "one_process", "ddp"]
        width = max(14, *(len(n) + 2 for n in names))
        print(f"{'contender':<{width}}{head}{'final acc':>11}{'train wall':>12}{'total wall':>12}")
        for name in names:
            r = a[name]
            cells = "".join(f"{_fmt(r[k]):>10}" for k in keys)
            print(
                f"{name:<{width}}{cells}{r['final_accuracy']:>11.4f}"
                f"{_fmt(r['train_wall']):>12}{_fmt(r['total_wall']):>12}"
            )
    if "b" in res:
        b = res["b"]
        k = f"time_to_{_pct(s.target_b)}"
        print(
            f"\n(b) kill schedule (SIGKILL every ~{b['kill_interval']:.0f}s, "
            f"seed {b['kill_seed']}), cnn1d width {b['width']}, {b['epochs']} epochs, global "
            f"batch {b['global_batch']} (vcdl: {b['worker_batch']} per worker), "
            f"medians of {b['repeats']}:"
        )
        names = ["vcdl", *(f"vcdl {v}" for v in b.get("variants", [])), "ddp"]
        width = max(14, *(len(n) + 2 for n in names))
        print(
            f"{'contender':<{width}}{'to ' + k[8:] + '%':>10}{'final acc':>11}{'kills':>7}"
            f"{'train wall':>12}{'total wall':>12}"
        )
        for name in names:
            r = b[name]
            print(
                f"{name:<{width}}{_fmt(r[k]):>10}{r['final_accuracy']:>11.4f}{r['kills']:>7.0f}"
                f"{_fmt(r['train_wall']):>12}{_fmt(r['total_wall']):>12}"
            )
        print(
            f"DDP restarts resumed from a checkpoint: {b['ddp']['resumed_from_checkpoint']}; "
            f"vcdl attempts: {b['vcdl']['runs'][0]['attempt_states']}"
        )
    print(
        "\ntime zero: vcdl = driver's first shard submission (workers up and warm); one process "
        "and DDP = rank 0's first training step. Accuracy = durable states evaluated afterwards."
    )
    for v in res["verdicts"]:
        print(f"{v['result'] or 'N/A'}: {v['target']}: {v['figures']}")


def summary_line(res: dict[str, Any]) -> dict[str, Any]:
    """The one-line JSON summary: medians and verdicts, no curves."""
    out: dict[str, Any] = {"benchmark": "time_to_accuracy", "samples": res["settings"]["samples"]}
    for part in ("a", "b"):
        if part in res:
            out[part] = {
                name: {k: v for k, v in r.items() if k != "runs"} if isinstance(r, dict) else r
                for name, r in res[part].items()
                if name != "schedule_first_10"
            }
    out["verdicts"] = {v["target"]: v["result"] for v in res["verdicts"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 000 samples, small models (CI)")
    p.add_argument("--parts", default="ab", help="which parts: a, b or ab")
    p.add_argument("--repeats", type=int, help="repeats of part (a) (default 3; quick 1)")
    p.add_argument("--repeats-b", type=int, help="repeats of part (b) (default 1)")
    p.add_argument("--kill-interval", type=float, help="mean seconds between kills (default 15)")
    p.add_argument("--kill-seed", type=int)
    p.add_argument("--cache-dir", help="where the data set is generated once")
    p.add_argument("--work-dir", help="keep every run's files here (default: a temp dir)")
    p.add_argument("--json-out", help="also write every figure (curves included) to this file")
    p.add_argument(
        "--set-a",
        action="append",
        metavar="KEY=VALUE",
        help="config override for part (a), every contender (e.g. train.lr=0.01); "
        "replaces the defaults when given",
    )
    p.add_argument(
        "--vcdl-also",
        action="append",
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="one more vcdl contender, run beside the shipped config in each part "
        "(e.g. merge.rule=delta); repeatable",
    )
    args = p.parse_args()
    s = QUICK if args.quick else Settings()
    if args.vcdl_also:
        s = replace(s, variants=tuple(args.vcdl_also))
    s = replace(s, parts=tuple(args.parts))
    if args.set_a is not None:
        s = replace(s, overrides_a=tuple(args.set_a))
    for arg, name in (
        ("repeats", "repeats_a"),
        ("repeats_b", "repeats_b"),
        ("kill_interval", "kill_interval"),
        ("kill_seed", "kill_seed"),
        ("cache_dir", "cache_dir"),
    ):
        if getattr(args, arg) is not None:
            s = replace(s, **{name: getattr(args, arg)})
    work = Path(args.work_dir) if args.work_dir else None
    res = run_benchmark(s, work, log=lambda m: print(m, flush=True))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=1))
    print_report(res, s)
    print(json.dumps(summary_line(res)))


if __name__ == "__main__":
    main()

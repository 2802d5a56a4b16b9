"""The DistributedDataParallel contender of benchmarks/time_to_accuracy.py.

Launched by ``torchrun`` (gloo, CPU), e.g.::

    python -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --max-restarts 50 \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29511 \\
        benchmarks/ddp_train.py --config run.json --data mnist1d.npz --out DIR --checkpoint

Trains the run config's model (``vcdl.models`` factory, seeded as vcdl seeds
it) with the config's optimizer (``vcdl.worker.loop.make_optimizer``) on the cached
MNIST-1D arrays, a ``DistributedSampler`` per epoch. The global batch is
``--batch`` (default: the config's batch size) split over the ranks, so one
optimizer step sees as many samples as in the other contenders.

Rank 0 owns ``DIR/events.jsonl`` (one JSON object per line, ``time`` is
``time.time()``):

* ``start``: a process group formed (``restart`` = torchrun's restart count,
  ``resumed_epoch`` = the checkpoint resumed from, or null);
* ``t0``: the first training step of the first incarnation — time zero;
* ``epoch``: an epoch's training loop finished (``train_seconds``);
* ``checkpoint``: with ``--checkpoint``, ``DIR/ckpt-EEE.pt`` is durable
  (written to a temporary file, then renamed; ``write_seconds``);
* ``done``.

Without ``--checkpoint`` (fault-free part), rank 0 instead copies the model's
state ``--snapshots`` times per epoch into memory with its time and writes
them all to ``DIR/snapshots.pt`` after the last step (outside the timing).
Nothing is evaluated here: the benchmark evaluates snapshots and checkpoints
afterwards, untimed.

No benchmark of its own (so none of benchmarks/harness.py's options; its
``--out`` is the events' directory): ``torchrun`` starts it by its path, and
it imports only ``vcdl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from vcdl.config import RunConfig
from vcdl.models import build_model
from vcdl.worker.loop import make_optimizer


def _event(log: Path, **fields: Any) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"time": time.time(), **fields}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _latest_checkpoint(out: Path) -> Path | None:
    found = sorted(out.glob("ckpt-*.pt"))
    return found[-1] if found else None


def _has_t0(events: Path) -> bool:
    if not events.exists():
        return False
    return any(json.loads(line).get("event") == "t0" for line in events.read_text().splitlines())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="run config as JSON (RunConfig)")
    p.add_argument("--data", required=True, help=".npz with x_train, y_train")
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, help="global batch (default: the config's)")
    p.add_argument("--checkpoint", action="store_true", help="checkpoint every epoch, resume")
    p.add_argument("--snapshots", type=int, default=8, help="in-memory snapshots per epoch")
    p.add_argument("--pg-timeout", type=float, default=30.0, help="process-group timeout, seconds")
    p.add_argument(
        "--pg-store",
        help="FileStore path prefix, unique to this torchrun (default: DIR/pg-store)",
    )
    args = p.parse_args()

    torch.set_num_threads(1)
    out = Path(args.out)
    # One fresh FileStore per incarnation, not torchrun's agent store: with
    # the agent store, a rank SIGKILLed while the group formed left the next
    # incarnation's ranks both stuck in ProcessGroupGloo's connectFullMesh
    # (agent idle, no restart) for minutes — 4 runs in 15 here. The file
    # name carries torchrun's restart count, so no key of a dead incarnation
    # is ever read. The timeout bounds any other hang (gloo's default is 30
    # minutes); healthy collectives here take milliseconds.
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    prefix = args.pg_store or str(out / "pg-store")
    pg_store = dist.FileStore(f"{prefix}-{restart}", world)
    dist.init_process_group(
        "gloo",
        store=pg_store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.pg_timeout),
    )
    cfg = RunConfig.model_validate_json(Path(args.config).read_text())
    events = out / "events.jsonl"
    with np.load(args.data, allow_pickle=False) as npz:
        x = torch.from_numpy(npz["x_train"])
        y = torch.from_numpy(npz["y_train"])

    torch.manual_seed(cfg.run.seed)  # as vcdl.driver.runs.new_model: same initial weights
    model = build_model(
        cfg.model.factory, cfg.model.kwargs, input_shape=tuple(x.shape[1:]), num_classes=10
    )
    opt = make_optimizer(list(model.parameters()), cfg.train)
    first_epoch = 0
    resumed: int | None = None
    ckpt = _latest_checkpoint(out) if args.checkpoint else None
    if ckpt is not None:
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        resumed = int(state["epoch"])
        first_epoch = resumed + 1
    ddp = DistributedDataParallel(model)
    per_rank = max(1, (args.batch or cfg.train.batch_size) // world)
    # The sampler needs only len(); a range of row indices stands in for a Dataset.
    sampler: DistributedSampler[int] = DistributedSampler(
        range(len(x)),  # type: ignore[arg-type]
        num_replicas=world,
        rank=rank,
        seed=cfg.run.seed,
    )
    mark_t0 = rank == 0 and not _has_t0(events)
    if rank == 0:
        _event(
            events,
            event="start",
            restart=restart,
            resumed_epoch=resumed,
            world=world,
            # What glibc's allocator started with (set only by the tuned contender).
            malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        )
    steps = -(-sampler.num_samples // per_rank)
    every = max(1, steps // max(1, args.snapshots))
    snapshots: list[tuple[float, int, dict[str, torch.Tensor]]] = []

    for epoch in range(first_epoch, cfg.run.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.long)
        ddp.train()
        start = time.perf_counter()
        for step, i in enumerate(range(0, len(order), per_rank)):
            if mark_t0:
                _event(events, event="t0")
                mark_t0 = False
            idx = order[i : i + per_rank]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x[idx]), y[idx]).backward()
            opt.step()
            if rank == 0 and not args.checkpoint and (step + 1) % every == 0:
                state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                snapshots.append((time.time(), epoch, state))
        if rank == 0:
            _event(events, event="epoch", epoch=epoch, train_seconds=time.perf_counter() - start)
        if args.checkpoint and rank == 0:
            # Atomic: a process killed mid-write leaves a .tmp, never a torn checkpoint.
            began = time.perf_counter()
            final = out / f"ckpt-{epoch:03d}.pt"
            tmp = final.with_suffix(".tmp")
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, tmp
            )
            os.replace(tmp, final)
            _event(
                events,
                event="checkpoint",
                epoch=epoch,
                path=str(final),
                write_seconds=time.perf_counter() - began,
            )
    if rank == 0:
        _event(events, event="done")
        if snapshots:  # after the timing: what the fault-free run would have had in memory
            torch.save(
                {
                    "times": [t for t, _, _ in snapshots],
                    "epochs": [e for _, e, _ in snapshots],
                    "states": [s for _, _, s in snapshots],
                },
                out / "snapshots.pt",
            )
    # Both ranks finish together, then leave without tearing gloo down: its
    # teardown aborted a rank now and then ("terminate called without an
    # active exception", SIGABRT, once at destroy_process_group even after
    # this barrier) and failed a finished run in CI. Everything of the run is
    # written and closed by now; _exit skips the C++ destructors that abort.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

"""A chaos soak: a config trained again and again under simulated preemption, each run audited.

Before a setting is trusted on a real spot fleet (a new merge rule,
``merge.fold``, a bigger fleet), it should survive many kills in many
runs, not one. Each run here is ``vcdl train CONFIG`` as a user starts it,
with ``--preempt RATE`` (worker kills and preemption notices, Poisson,
seeded by the run); every ``--kill-driver-every``-th run also has its
driver SIGKILLed once ``--kill-driver-after`` epochs are complete, and is
finished by ``vcdl resume``. Then, per run:

* the run's end (state, epochs, exit code) and its test accuracy;
* the events that landed (kills and notices sent) and what the driver
  counted (duplicates, rejections);
* the versions, and how many were folded (``merge.fold``);
* ``audit_run(deep=True)``: every invariant of the ledger and every stored
  version's checksums; and the orphans a sweep still finds (should be none).

A run that does not complete, an audit problem or a left orphan makes the
soak fail (exit 1): the figures are printed first. One JSON line ends it.
``--runs`` is its repeats (``--repeats`` is the same option): each run is a
verdict of its own, not a sample of a timing, so there is no median.

    python -m benchmarks.soak examples/mnist1d.toml --runs 3 \\
        --set merge.fold=4 cluster.workers=4 data.shards=16 train.batch_size=25 \\
        train.local_epochs=4 fault.checkpoint_seconds=0.1
    python -m benchmarks.soak --quick     # CI: one short run of mnist1d, fold 4, a killed driver
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cli_proc import reap, start_vcdl
from benchmarks.harness import REPO, add_common_options, emit_summary, human_output
from vcdl.chaos import DEFAULT_START

EXAMPLE = REPO / "examples" / "mnist1d.toml"
QUICK_SETS = [
    "run.epochs=2",
    # Epochs of a few seconds, and the simulator's first event 1 s into each
    # run part (QUICK_PREEMPT_START, not the default 5 s), so that the first
    # part, up to the driver's kill, takes several events (3 here, 2026-11-28).
    # The resumed part's one epoch (~1.5 s) mostly ends before its first.
    "data.samples=16000",
    "data.shards=8",
    "merge.fold=4",
    "train.local_epochs=4",
    "fault.checkpoint_seconds=0.1",
]
QUICK_PREEMPT_START = 1.0


def _epochs_done(home: Path, run: str) -> int:
    from vcdl.ledger import Ledger

    db = home / "ledger.db"
    found = Ledger(f"sqlite:///{db}").find_run(run) if db.exists() else None
    return 0 if found is None else found.epochs_completed


def soak_run(
    config: Path,
    sets: list[str],
    home: Path,
    seed: int,
    rate: float,
    kill_after: int | None,
    preempt_start: float = DEFAULT_START,
) -> dict[str, Any]:
    """One run under chaos (its driver killed once ``kill_after`` epochs are done, if set)."""
    from vcdl import api
    from vcdl.chaos import sent_counts
    from vcdl.driver.runs import clean_orphans
    from vcdl.views.audit import audit_run

    home.mkdir(parents=True, exist_ok=True)
    log = home / "chaos.jsonl"
    chaos = ["--preempt", str(rate), "--preempt-notices", "0.3", "--preempt-grace", "2"]
    chaos += ["--preempt-start", str(preempt_start)]
    chaos += ["--preempt-seed", str(seed), "--preempt-log", str(log)]
    overrides = [x for s in [*sets, f"run.seed={seed}"] for x in ("--set", s)]
    start = time.monotonic()
    driver = start_vcdl(home, "train", str(config), "--run", "soak", *overrides, *chaos)
    killed = False
    try:
        if kill_after is not None:
            while driver.poll() is None and _epochs_done(home, "soak") < kill_after:
                time.sleep(0.5)
            if driver.poll() is None:
                driver.send_signal(signal.SIGKILL)  # mid-run, no cleanup
                driver.wait(30)
                killed = True
        else:
            driver.wait(3600)
    finally:
        reap(driver)
    code = driver.returncode
    if killed:
        chaos[chaos.index("--preempt-seed") + 1] = str(seed + 1000)  # a schedule of its own
        resumed = start_vcdl(home, "resume", "soak", *chaos)
        try:
            code = resumed.wait(3600)
        finally:
            reap(resumed)
    status = api.status("soak", home=home)
    ref = api.run_ref("soak", home=home)
    versions = ref.ledger().versions("soak")
    sent = sent_counts(log)
    return {
        "seed": seed,
        "driver_killed": killed,
        "exit_code": code,
        "state": status["state"],
        "epochs_completed": status["epochs_completed"],
        "seconds": round(time.monotonic() - start, 1),
        "kills": sent["kill"],
        "notices": sent["notice"],
        "versions": len(versions) - 1,  # v0 is the initial weights
        "versions_folded": sum(1 for v in versions if v.checksum == "folded"),
        "duplicates": status.get("duplicates"),
        "rejections": status.get("rejections"),
        "test_accuracy": status.get("test_accuracy"),
        "audit_problems": audit_run(ref, deep=True),
        "orphans_left": clean_orphans(ref),
    }


def problems_of(run: dict[str, Any], epochs: int | None) -> list[str]:
    """What makes a soak run a failure (empty: it passed)."""
    out = []
    if run["state"] != "completed" or run["exit_code"] != 0:
        out.append(f"ended {run['state']} (exit {run['exit_code']})")
    if epochs is not None and run["epochs_completed"] != epochs:
        out.append(f"{run['epochs_completed']} of {epochs} epochs")
    out += [f"audit: {p}" for p in run["audit_problems"]]
    if run["orphans_left"]:
        out.append(f"{len(run['orphans_left'])} orphan group(s) left")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", type=Path, default=EXAMPLE)
    p.add_argument("--runs", "--repeats", type=int, default=3, help="runs (default 3)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--preempt", type=float, default=1.0, help="events per second (Poisson)")
    p.add_argument(
        "--kill-driver-every",
        type=int,
        default=2,
        help="kill the driver in every n-th run (0: never), then resume it",
    )
    p.add_argument("--kill-driver-after", type=int, default=2, help="epochs completed first")
    p.add_argument(
        "--preempt-start",
        type=float,
        default=DEFAULT_START,
        metavar="SECONDS",
        help=f"seconds from each run part's cluster start to its first event "
        f"(default {DEFAULT_START:g})",
    )
    p.add_argument("--seed", type=int, default=1, help="the first run's seed (one more per run)")
    p.add_argument("--home", type=Path, help="keep the runs' homes here (default: a temp dir)")
    add_common_options(
        p,
        quick_help=f"CI: {' '.join(QUICK_SETS)}, --preempt-start {QUICK_PREEMPT_START:g}",
        repeats=False,
    )
    args = p.parse_args()
    sets, runs, every = list(args.set), args.runs, args.kill_driver_every
    after, preempt_start = args.kill_driver_after, args.preempt_start
    if args.quick:
        sets, runs, every, after = QUICK_SETS + sets, 1, 1, 1
        preempt_start = QUICK_PREEMPT_START
    if runs < 1:
        p.error(f"--runs must be at least 1, got {runs}")
    if not args.config.is_file():
        p.error(f"no config file at {args.config}")
    from vcdl.config_files import load_config

    epochs = load_config(args.config, sets).run.epochs  # a bad override fails here, clearly
    results = []
    with human_output(args), tempfile.TemporaryDirectory(prefix="vcdl-soak-") as tmp:
        root = args.home or Path(tmp)
        for i in range(runs):
            seed = args.seed + i
            kill = after if every and (i + 1) % every == 0 else None
            run = soak_run(
                args.config, sets, root / f"run-{seed}", seed, args.preempt, kill, preempt_start
            )
            run["problems"] = problems_of(run, epochs)
            results.append(run)
            verdict = "clean" if not run["problems"] else "PROBLEMS: " + "; ".join(run["problems"])
            killed = ", driver killed and resumed" if run["driver_killed"] else ""
            print(
                f"run {i + 1}/{runs} (seed {seed}{killed}): {run['state']} in "
                f"{run['seconds']:.0f} s, {run['kills']} kills and {run['notices']} notices "
                f"sent, {run['versions']} versions ({run['versions_folded']} folded), "
                f"accuracy {run['test_accuracy']}, {verdict}",
                flush=True,
            )
    failed = [r["seed"] for r in results if r["problems"]]
    summary = {
        "config": str(args.config),
        "set": sets,
        "runs": results,
        "kills": sum(r["kills"] for r in results),
        "versions_folded": sum(r["versions_folded"] for r in results),
        "failed_seeds": failed,
    }
    emit_summary("soak", summary, args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

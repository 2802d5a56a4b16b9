"""Prefect's task engine on a Dask worker: prefect-dask's client against vcdl's.

Every vcdl attempt is a Prefect task run on a Dask worker, and before its body
runs the engine on the worker hydrates the flow's context. With prefect-dask's
own client that rebuilt Prefect's ``Settings`` from a dict and opened two new
API clients (each loading the CA bundle) at every task: ~0.27 s per task here,
paid at every epoch barrier while the workers idle. vcdl's client
(``flows/workarounds/task_settings.py``) builds both once per worker.

One LocalCluster worker (one thread, the flow's Prefect API in its
environment, as vcdl starts them), tasks whose body returns at once, submitted
one at a time from a subflow; the two clients alternate subflow by subflow, a
warm-up subflow each first. Per task: **submit → body** (the driver's submit
until the body starts: Dask scheduling and the engine before the body) and
**body → result** (the engine after it and the result's way back), medians.

    python -m benchmarks.task_engine             # 5 rounds x 20 tasks per client
    python -m benchmarks.task_engine --quick     # 2 rounds x 5 tasks (CI)

``--rounds`` is its repeats (``--repeats`` is the same option). Ends with a
one-line JSON summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from benchmarks.harness import add_common_options, emit_summary, human_output, median

# Before prefect is imported: no telemetry from an offline machine; time for
# the ephemeral API to start on a busy one (as vcdl.api.prepare_prefect).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect_dask.client import PrefectDaskClient

from flows.cluster import prefect_api_url
from flows.workarounds.shared_runner import shared_task_runner
from flows.workarounds.task_settings import VcdlDaskClient

CLIENTS: dict[str, type[PrefectDaskClient]] = {
    "prefect-dask's PrefectDaskClient": PrefectDaskClient,
    "vcdl's VcdlDaskClient": VcdlDaskClient,
}


@task(name="noop", cache_policy=NO_CACHE, persist_result=False)
def noop() -> tuple[float, float]:
    """The body's start and end on the worker's clock (the driver's: one machine)."""
    now = time.time()
    return now, time.time()


@flow(name="task-engine-bench")
def tasks(n: int) -> list[tuple[float, float]]:
    """``n`` tasks one at a time: (submit → body, body → result) seconds each."""
    rows = []
    for _ in range(n):
        sent = time.time()
        started, ended = noop.submit().result()
        rows.append((started - sent, time.time() - ended))
    return rows


def measure(rounds: int, n: int, log: Any = print) -> dict[str, dict[str, Any]]:
    """Alternate the clients subflow by subflow on one worker; medians per client."""
    from distributed import LocalCluster

    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}

    @flow(name="task-engine-bench-parent")
    def parent() -> None:
        url = prefect_api_url()
        env = {"PREFECT_API_URL": url} if url else {}
        with LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", env=env
        ) as cluster:
            for cls in CLIENTS.values():  # warm-up: imports, the first settings
                with shared_task_runner(cluster.scheduler_address, cls) as runner:
                    tasks.with_options(task_runner=runner)(2)  # type: ignore[arg-type]
            for r in range(rounds):
                order = list(CLIENTS.items())
                for name, cls in order if r % 2 == 0 else order[::-1]:
                    with shared_task_runner(cluster.scheduler_address, cls) as runner:
                        got = tasks.with_options(task_runner=runner)(n)  # type: ignore[arg-type]
                    rows[name] += got
                    log(
                        f"round {r + 1}/{rounds} {name}: submit->body median "
                        f"{median(g[0] for g in got):.3f} s"
                    )

    parent()
    return {
        name: {
            "tasks": len(rs),
            "submit_to_body_s": round(median(r[0] for r in rs), 4),
            "body_to_result_s": round(median(r[1] for r in rs), 4),
        }
        for name, rs in rows.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_options(parser, quick_help="2 rounds x 5 tasks (CI)", repeats=False)
    parser.add_argument(
        "--rounds", "--repeats", type=int, default=None, help="subflows per client (5)"
    )
    parser.add_argument("--tasks", type=int, default=None, help="tasks per subflow (20)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    n = args.tasks or (5 if args.quick else 20)
    if rounds < 1 or n < 1:
        parser.error("--rounds and --tasks must be at least 1")
    with human_output(args):
        res = measure(rounds, n)
        old, new = (res[name] for name in CLIENTS)
        print(f"\nPrefect task engine on a Dask worker, {rounds} rounds x {n} tasks per client:")
        print("| client | submit -> body (median) | body -> result (median) |")
        print("|---|---|---|")
        for name, r in res.items():
            print(f"| {name} | {r['submit_to_body_s']:.3f} s | {r['body_to_result_s']:.3f} s |")
        saved = old["submit_to_body_s"] - new["submit_to_body_s"]
        print(f"vcdl's client saves {saved:.3f} s before every task body.")
    emit_summary("task_engine", {"rounds": rounds, "tasks": n, "results": res}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Dask cluster a train flow runs on, and what its workers need to know.

A configured ``cluster.address`` is used as is (its workers must already have
``PREFECT_API_URL`` in their environment, see docs). Otherwise a
``LocalCluster`` of worker processes is started for the flow's lifetime, with
the flow's Prefect API URL in every worker's environment: without it each
Dask worker starts its own temporary Prefect server (STACK-NOTES.md).

Every worker, also one that joins later, gets vcdl's worker plugins: the
preemption-notice handler and a warm-up that imports torch, Prefect's task
engine and vcdl's hot path when the worker starts. Without it each worker's
first shard task stalls 5-7 s on imports while the run is already under way
(benchmarks/overhead.py); with it the stall is part of starting the cluster,
as on a warm fleet. The warm-up also sets the C allocator's thresholds for
training (vcdl/allocator.py): with Dask's default environment every worker
trained ~40 % slower than a plain process.

The epoch subflows submit through one task runner whose Dask client stays
open for the whole run (prefect-dask's own closes it at the end of every
subflow, ~0.5 s of the barrier).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from prefect_dask import DaskTaskRunner
from prefect_dask.client import PrefectDaskClient

from flows.forkserver import forked_workers
from flows.task_context import VcdlDaskClient
from flows.watchdog import ClusterWatchdog
from vcdl.allocator import tune_allocator
from vcdl.config import RunConfig
from vcdl.console import install_for_process

log = logging.getLogger(__name__)


def prefect_api_url() -> str | None:
    """The API the current flow reports to, including Prefect's ephemeral server."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return str(url)
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    return server.api_url if server.running else None


def worker_env(cfg: RunConfig) -> dict[str, str]:
    """Environment for LocalCluster workers: the Prefect API and thread counts."""
    threads = str(cfg.train.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    url = prefect_api_url()
    if url:
        env["PREFECT_API_URL"] = url
    return env


def training_slots(cfg: RunConfig) -> int | None:
    """Attempts one worker trains at once, when vcdl started the cluster; else None.

    vcdl's LocalCluster gives each worker one Dask thread more than this (see
    :func:`vcdl.attempt.training_slot`). A cluster given by address keeps its
    own workers' thread counts: every thread may train, as before.
    """
    return None if cfg.cluster.address else cfg.cluster.threads_per_worker


#: Dask loggers whose INFO records are a normal run's routine, or tracebacks
#: of a normal shutdown.
BENIGN_INFO_LOGGERS = (
    "distributed.batched",
    "distributed.scheduler",
    "distributed.core",
    "distributed.nanny",
    "distributed.http.proxy",
)


def quiet_benign_logs() -> None:
    """Raise the loggers of :data:`BENIGN_INFO_LOGGERS` to WARNING.

    When a worker's connection closes (the run ending, a worker retired or
    killed), the scheduler's batched stream logs "Batched Comm Closed" at INFO
    *with a full CommClosedError traceback*: at the end of a successful run a
    user saw a traceback and took it for a failure. The LocalCluster's
    scheduler and nannies live in the driver, and their INFO records (a worker
    registered, a client connected, a stream closed: 41 lines in the README's
    run) buried its progress lines; ``silence_logs`` does not reach them once
    Prefect and vcdl's console own the handlers. Their warnings and errors
    (a worker restarted, a task failed) still show, and a stricter level the
    user set is kept.
    """
    for name in BENIGN_INFO_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)


@contextmanager
def dask_cluster(cfg: RunConfig) -> Iterator[str]:
    """Yield a scheduler address: the configured one, or a LocalCluster's."""
    quiet_benign_logs()
    if cfg.cluster.address:
        register_worker_plugins(cfg.cluster.address)
        yield cfg.cluster.address
        return
    from distributed import LocalCluster

    env = worker_env(cfg)
    with (
        forked_workers(env) if cfg.cluster.start_method == "forkserver" else nullcontext(),
        LocalCluster(
            n_workers=cfg.cluster.workers,
            # One thread more than the attempts a worker trains at once: Prefect's
            # engine sets up the next task while the current one trains (see
            # vcdl.attempt.training_slot).
            threads_per_worker=cfg.cluster.threads_per_worker + 1,
            processes=True,
            memory_limit=cfg.cluster.memory_limit,
            # The scheduler always serves HTTP (health, and the dashboard when
            # bokeh is installed); a random port keeps parallel runs from clashing.
            dashboard_address=":0",
            env=env,
            silence_logs=logging.WARNING,
        ) as cluster,
    ):
        log.info(
            "LocalCluster with %d workers at %s", cfg.cluster.workers, cluster.scheduler_address
        )
        register_worker_plugins(cluster.scheduler_address)
        # Restarts workers the cluster gave up on (flows/watchdog.py).
        watchdog = ClusterWatchdog(cluster, cfg.cluster.workers)
        watchdog.start()
        try:
            yield cluster.scheduler_address
        finally:
            watchdog.stop()


class SharedClientRunner(DaskTaskRunner):
    """A DaskTaskRunner whose copies (one per epoch subflow) share one open Dask client.

    prefect-dask opens a client when a subflow first submits and closes it when
    the subflow ends: ~0.5 s at every epoch barrier, with the workers idle.
    The client here belongs to :func:`shared_task_runner`, which closes it.
    """

    def __init__(self, client: PrefectDaskClient) -> None:
        super().__init__(address=client.scheduler.address)
        self._shared = client

    def duplicate(self) -> SharedClientRunner:
        return type(self)(self._shared)

    @property
    def client(self) -> PrefectDaskClient:
        return self._shared

    def __reduce__(self) -> tuple[Any, ...]:
        # The flow travels to the workers in the task's context, the runner
        # with it; a Dask client does not pickle, and workers submit nothing.
        return (functools.partial(DaskTaskRunner, address=self.address), ())


@contextmanager
def shared_task_runner(
    address: str, client_class: type[PrefectDaskClient] = VcdlDaskClient
) -> Iterator[SharedClientRunner]:
    """A task runner for the epoch subflows, its Dask client open for the whole run.

    vcdl's client also sends Prefect's settings so that each worker builds
    them once, not at every task (flows/task_context.py); benchmarks pass
    prefect-dask's own as ``client_class`` to compare.
    """
    with client_class(address, set_as_default=False) as client:
        yield SharedClientRunner(client)


def warm_up() -> None:
    """Import what a shard task needs and run torch once (its first op initializes kernels).

    A worker forked from the preloaded server (flows/forkserver.py) imported
    Prefect and torch before its nanny set its environment: Prefect's
    settings and torch's thread count are read again from it here.
    """
    import os

    import torch
    from prefect import task_engine  # noqa: F401  (the engine that runs every task)
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()  # PREFECT_API_URL: else the worker starts its own server
    # Dask's nanny set MALLOC_TRIM_THRESHOLD_, which makes every tensor
    # allocation a fresh mmap: training ran ~40 % slower (vcdl/allocator.py).
    tune_allocator()
    # The worker shares the driver's stdout/stderr: a blocked console must not
    # stall its task threads or its event loop either.
    install_for_process()
    quiet_benign_logs()  # a worker of an external fleet logs INFO by default
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    import flows.epoch  # noqa: F401  (the shard task and vcdl's hot path: ledger, store, train)

    model = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    model(torch.zeros(4, 1, 4)).sum().backward()
    torch.optim.Adam(model.parameters()).step()


class WarmupPlugin(WorkerPlugin):
    """Imports the hot path when a worker starts, before it is given any task."""

    name = "vcdl-warmup"

    async def setup(self, worker: Any) -> None:
        # Off the event loop: seconds of imports would stall the worker's heartbeats.
        await asyncio.get_running_loop().run_in_executor(None, warm_up)


def run_dask_client() -> PrefectDaskClient | None:
    """The Dask client the current flow run submits through (vcdl's shared one), or None."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx is not None else None
    return runner.client if isinstance(runner, SharedClientRunner) else None


def worker_left_at(worker: str, after: datetime, client: Client | None = None) -> datetime | None:
    """When the Dask scheduler removed ``worker`` (the first time after ``after``), if it did.

    The driver learns that an attempt's worker died only when Dask hands the
    task to someone else or gives up, often one whole attempt later; the
    scheduler logged the removal when the nanny saw the process die (or the
    heartbeats stopped). That moment is when the attempt really ended, and
    what the cost report bills it to. Asks ``client`` (the run's, see
    :func:`run_dask_client`: vcdl's is not Dask's default client), else the
    default client; None when there is none, or the worker was not removed.
    """
    try:
        if client is None:
            from distributed import default_client

            client = default_client()
        events = client.get_events(worker)
    except Exception:  # no client (tests, a driver outside Dask), scheduler gone
        return None
    for stamp, msg in events:
        if isinstance(msg, dict) and msg.get("action") == "remove-worker":
            at = datetime.fromtimestamp(float(stamp), UTC)
            if at >= after:
                return at
    return None


def register_worker_plugins(address: str) -> None:
    """Install vcdl's worker plugins; the scheduler re-applies them to workers that join later.

    Returns once every current worker has run their setup (the warm-up included).
    """
    from vcdl.preemption import PreemptionPlugin

    with Client(address, timeout=60) as client:
        client.register_plugin(PreemptionPlugin())
        client.register_plugin(WarmupPlugin())

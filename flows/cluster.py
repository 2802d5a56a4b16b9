"""The Dask cluster a train flow runs on, and what its workers need to know.

A configured ``cluster.address`` is used as is (its workers must already have
``PREFECT_API_URL`` in their environment, see docs). Otherwise a
``LocalCluster`` of worker processes is started for the flow's lifetime, with
the flow's Prefect API URL in every worker's environment: without it each
Dask worker starts its own temporary Prefect server (docs/stack.md).

Every worker, also one that joins later, gets vcdl's worker plugins: the
worker runtime, with the preemption-notice handler (:mod:`vcdl.worker.runtime`),
and the warm-up (:mod:`flows.workarounds.warmup`). The epoch subflows submit through one task
runner whose Dask client stays open for the whole run
(:mod:`flows.workarounds.shared_runner`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path

from distributed import Client, WorkerPlugin
from distributed.diagnostics.plugin import UploadFile

from flows.workarounds.dask_logs import quiet_benign_logs
from flows.workarounds.forkserver import forked_workers
from flows.workarounds.plugin_broadcast import register_surviving
from flows.workarounds.warmup import WarmupPlugin
from flows.workarounds.watchdog import ClusterWatchdog
from vcdl.config import RunConfig
from vcdl.dask_tls import client_tls_problem, handshake_refused
from vcdl.errors import ClusterUnreachable, ConfigError, ModelError
from vcdl.reach import local_resources_problem, no_scheduler, scheduler_unreachable
from vcdl.runcode import run_specs
from vcdl.usercode import (
    bundle,
    code_dirs,
    grant,
    local_modules,
    split_path,
)
from vcdl.worker.basecache import OVERLAP_ENV
from vcdl.worker.speed import speeds_label

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
    """Environment for LocalCluster workers: the Prefect API, thread counts, and the
    driver's ``VCDL_NETWORK_OVERLAP`` (:mod:`vcdl.worker.basecache`)."""
    threads = str(cfg.train.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    url = prefect_api_url()
    if url:
        env["PREFECT_API_URL"] = url
    # Given, not inherited: forked workers inherit the environment of the process's
    # first cluster (the forkserver's), not the driver's of this run.
    overlap = os.environ.get(OVERLAP_ENV)
    if overlap is not None:
        env[OVERLAP_ENV] = overlap
    return env


def training_slots(cfg: RunConfig) -> int | None:
    """Attempts one worker trains at once, when vcdl started the cluster; else None.

    vcdl's LocalCluster gives each worker one Dask thread more than this (see
    :class:`vcdl.worker.slots.TrainingSlots`). A cluster given by address keeps its
    own workers' thread counts: every thread may train, as before.
    """
    return None if cfg.cluster.address else cfg.cluster.threads_per_worker


def ship_user_code(address: str, cfg: RunConfig) -> list[str]:
    """Send the run's own modules to every worker, also those that join later; their names.

    The modules an import path of the run needs (model factory, objective,
    metrics), found beside its config file or in the current directory, and
    the local modules they import, go to the workers as one zip archive through
    Dask's ``UploadFile`` worker plugin, which imports them there. A module that
    fails to import on a worker fails the run here, once, with the worker's
    error in one line. Installed packages are the workers' image's business.
    """
    specs = run_specs(cfg.model.factory, cfg.train.objective, cfg.train.metrics)
    modules = local_modules(specs, code_dirs(cfg.run.code_dir))
    if not modules:
        return []
    names = [m.name for m in modules]
    with tempfile.TemporaryDirectory(prefix="vcdl-code-") as tmp:
        archive = bundle(modules, Path(tmp))
        try:
            with Client(address, timeout=60) as client:
                # The workers' plugin only: Client.upload_file would also load the
                # archive into the scheduler, which for a LocalCluster is this very
                # process, replacing modules of the same name that the driver
                # imported (and leaving a deleted archive on sys.path).
                register_surviving(client, UploadFile(str(archive), load=True), archive.stem)
        except Exception as exc:
            detail = " ".join(str(exc).split())[:300]
            raise ModelError(
                f"the run's module(s) {', '.join(names)} do not import on the Dask workers: "
                f"{type(exc).__name__}: {detail}; install what they need in the workers' "
                "environment (the driver imported them)"
            ) from None
    log.info("shipped the run's module(s) %s to the workers", ", ".join(names))
    return names


class ImportAllowance(WorkerPlugin):
    """Lets a worker import the modules its driver allowed for a run (docs/design.md §7).

    The driver checked the run's import paths against its own allowance
    (``$VCDL_ALLOW_IMPORTS``, and for ``vcdl train CONFIG`` the modules beside
    CONFIG) before anything was imported or submitted; a worker imports only
    what some driver allowed this way, or what its own ``$VCDL_ALLOW_IMPORTS``
    allows. The scheduler applies it to workers that join later too.
    """

    def __init__(self, modules: list[str]) -> None:
        self.modules = sorted(set(modules))
        digest = hashlib.sha256(",".join(self.modules).encode()).hexdigest()[:12]
        # One per set of modules: runs sharing a fleet keep each other's.
        self.name = f"vcdl-allow-imports-{digest}"

    def setup(self, worker: object) -> None:
        grant(self.modules)


def allow_run_imports(address: str, cfg: RunConfig) -> None:
    """Tell every worker (also later ones) which modules this run's import paths need."""
    modules = [
        p[0]
        for s in run_specs(cfg.model.factory, cfg.train.objective, cfg.train.metrics)
        if (p := split_path(s)) is not None
    ]
    if not modules:
        return
    with Client(address, timeout=60) as client:
        register_surviving(client, ImportAllowance(modules))


@contextmanager
def dask_cluster(cfg: RunConfig) -> Iterator[str]:
    """Yield a scheduler address: the configured one, or a LocalCluster's."""
    quiet_benign_logs()
    if cfg.cluster.address:
        # Before the first client: a run started without the CLI's check (a
        # deployment, the API) says what is wrong at once, not after Dask's
        # connect timeout in a traceback.
        tls_problem = client_tls_problem(cfg.cluster.address)
        if tls_problem is not None:
            raise ConfigError(tls_problem)
        problem = scheduler_unreachable(cfg.cluster.address)
        if problem is None:
            try:
                register_worker_plugins(cfg.cluster.address)
            except OSError as exc:
                refused = handshake_refused(cfg.cluster.address, exc)
                if refused:
                    raise ClusterUnreachable(refused) from None
                problem = str(exc)
        if problem is not None:
            raise ClusterUnreachable(no_scheduler(cfg.cluster.address, f"({problem})"))
        allow_run_imports(cfg.cluster.address, cfg)
        ship_user_code(cfg.cluster.address, cfg)
        if cfg.cluster.speeds:
            log.info("workers named 0, 1, ... run at %s", speeds_label(cfg.cluster.speeds))
        yield cfg.cluster.address
        return
    from distributed import LocalCluster

    # A run started without the CLI's preflight (a deployment): refused before
    # the cluster starts, not a wait without end for a worker offering a GPU.
    problem = local_resources_problem(cfg.cluster)
    if problem is not None:
        raise ConfigError(problem)
    env = worker_env(cfg)
    with (
        forked_workers(env) if cfg.cluster.start_method == "forkserver" else nullcontext(),
        LocalCluster(
            n_workers=cfg.cluster.workers,
            # One thread more than the attempts a worker trains at once: Prefect's
            # engine sets up the next task while the current one trains (see
            # vcdl.worker.slots.TrainingSlots).
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
            "LocalCluster with %d workers at %s%s",
            cfg.cluster.workers,
            cluster.scheduler_address,
            f" ({speeds_label(cfg.cluster.speeds)})" if cfg.cluster.speeds else "",
        )
        register_worker_plugins(cluster.scheduler_address)
        allow_run_imports(cluster.scheduler_address, cfg)
        ship_user_code(cluster.scheduler_address, cfg)
        # Restarts workers the cluster gave up on (flows/workarounds/watchdog.py).
        watchdog = ClusterWatchdog(cluster, cfg.cluster.workers)
        watchdog.start()
        try:
            yield cluster.scheduler_address
        finally:
            watchdog.stop()


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
    The runtime's plugin is registered once per cluster: a later run on the same
    fleet leaves each worker's runtime as it is.
    """
    from vcdl.worker.runtime import VcdlWorkerPlugin

    with Client(address, timeout=60) as client:
        register_surviving(client, VcdlWorkerPlugin())
        register_surviving(client, WarmupPlugin())

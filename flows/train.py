"""The ``vcdl-train`` flow: a run's epochs, each a ``vcdl-epoch`` subflow on Dask.

Reads as a plain sequence: prepare (create or resume) the run, take the run's
lease, start or connect to the Dask cluster, then run the epoch subflow for
each remaining epoch, in order (vcdl/driver/epoch_loop.py). The ledger decides what
is left to do, so running the flow again with the same run name resumes
where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import torch
from prefect import get_run_logger
from prefect.exceptions import TerminationSignal
from pydantic import BaseModel, ConfigDict, Field

from flows.cluster import dask_cluster
from flows.epoch import epoch_flow
from flows.guard import check_train_form
from flows.params import guarded_flow
from flows.reporting import (
    ProgressUpdater,
    emit,
    publish_summary,
    start_progress,
)
from flows.workarounds.heartbeats import epoch_heartbeats_off
from flows.workarounds.shared_runner import shared_task_runner
from vcdl.chaos import (
    DEFAULT_START,
    MAX_GRACE,
    MAX_RATE,
    MAX_START,
    Preemptor,
    chaos_schedule,
)
from vcdl.config import RunConfig
from vcdl.config_files import resolve_home, run_log_path
from vcdl.console import console_off_thread
from vcdl.driver.epoch_loop import run_epochs
from vcdl.driver.head_cache import forget_run_cache
from vcdl.driver.lease import run_lease
from vcdl.driver.runs import clean_orphans, prepare_run
from vcdl.errors import LeaseLost
from vcdl.metrics.exporter import follow_run, serve_metrics
from vcdl.runtime import RunRef
from vcdl.views import observe
from vcdl.views.status import run_status


class ChaosSpec(BaseModel):
    """Simulated preemptions during a run (testing and demos, never production)."""

    model_config = ConfigDict(allow_inf_nan=False)

    rate: float = Field(..., ge=0, le=MAX_RATE, description="Events per second (Poisson).")
    notice_fraction: float = Field(0.25, ge=0, le=1, description="Share of events with notice.")
    grace: float = Field(2.0, ge=0, le=MAX_GRACE, description="Seconds between notice and kill.")
    seed: int = Field(0, description="Seed of the schedule and the victims.")
    start_after: float = Field(
        DEFAULT_START, ge=0, le=MAX_START, description="Seconds to the first event."
    )
    log: str | None = Field(None, description="JSON-lines file recording every event.")


@contextmanager
def preemptions(address: str, spec: ChaosSpec | None) -> Iterator[Preemptor | None]:
    """Run the preemption simulator against the cluster while the body runs."""
    if spec is None or spec.rate == 0:
        yield None
        return
    events = chaos_schedule(
        spec.rate, 24 * 3600, spec.seed, spec.notice_fraction, start_after=spec.start_after
    )
    p = Preemptor(
        address,
        events,
        grace=spec.grace,
        seed=spec.seed,
        log_path=spec.log,
        # Fire only while at least two workers are up: a worker killed while
        # its nanny is still starting it can leave a LocalCluster with none.
        min_workers=2,
    )
    p.start()
    try:
        yield p
    finally:
        p.stop()
        # Its Dask client must close before the cluster does: a client left
        # open reconnects to the closed scheduler and logs ConnectionRefused
        # tracebacks after a successful run.
        p.join(timeout=30)


def _named(config: RunConfig) -> RunConfig:
    if config.run.name:
        return config
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return config.updated(run={"name": f"{config.data.name}-{stamp}"})


# Formatted by Prefect with the epoch subflow's parameters.
EPOCH_RUN_NAME = "{ref.run} · epoch {epoch}"


def sweep_orphans(ref: RunRef) -> None:
    """Delete the groups killed workers wrote but never recorded, at the end of a run.

    A worker SIGKILLed between writing a result or a checkpoint and
    recording it (or in the middle of the write) leaves a group the ledger
    never names; a resuming driver removes them first, but a run that
    finishes is never resumed, and on S3 they would be paid for until
    someone looks. Runs inside the lease, after this driver's cluster has
    closed. Best effort: the run is trained, and a store error here must
    not fail it (``vcdl resume RUN`` sweeps again).
    """
    log = get_run_logger()
    try:
        removed = clean_orphans(ref)
    except Exception as exc:
        log.warning(
            "could not remove groups that killed workers left in the store (%s: %s); "
            "`vcdl resume %s` removes them",
            type(exc).__name__,
            exc,
            ref.run,
        )
        return
    if removed:
        log.info(
            "removed %d group(s) that killed workers wrote but never recorded: %s",
            len(removed),
            ", ".join(sorted(removed)[:5]) + (" ..." if len(removed) > 5 else ""),
        )


def opened(ref: RunRef, cfg: RunConfig, resumed: bool) -> observe.RunOpened:
    """Where the run stands as this driver takes it, with what earlier drivers counted."""
    ledger = ref.ledger()
    run = ledger.get_run(ref.run)
    kills = reissues = rejections = 0
    if resumed:  # a new run has nothing to count
        states = [a.state for a in ledger.attempts(ref.run)]
        kills = sum(1 for s in states if s in ("killed", "timeout"))
        rejections = states.count("rejected")
        reissues = sum(max(0, s.attempts - 1) for s in ledger.subtasks(ref.run))
    return observe.RunOpened(
        ref.run,
        cfg.run.epochs,
        cfg.data.shards,
        run.epochs_completed,
        run.head_version,
        kills,
        reissues,
        rejections,
    )


@guarded_flow(name="vcdl-train", persist_result=True)
def train(
    config: RunConfig = RunConfig(),  # noqa: B008  (frozen: safe as a default; the UI's form)
    home: str | None = None,
    chaos: ChaosSpec | None = None,
) -> dict[str, Any]:
    """Train (or resume) the run described by ``config``; returns its status summary.

    With ``metrics.port`` set, the run's Prometheus metrics are served while it
    runs (vcdl/metrics/exporter.py, docs/metrics.md).

    The summary is the flow run's persisted result, so
    ``run_deployment(...).state.result()`` returns it where the result
    storage is readable; ``vcdl status RUN --json`` prints the same. A failure
    emits the Prefect event ``vcdl.run.failed`` on resource ``vcdl.run.<run>``.

    Started from a deployment (the UI's form), it imports only what
    ``$VCDL_ALLOW_IMPORTS`` allows and keeps the deployment's locations
    (flows/guard.py, docs/design.md §7).
    """
    cfg = _named(config)
    try:
        check_train_form(cfg, home, chaos)
        # Bound before the run is prepared: a port in use writes nothing.
        with serve_metrics(cfg.metrics, str(cfg.run.name)) as served:
            if served is not None:
                get_run_logger().info("metrics of the run at %s", served.url)
            return _train(cfg, home, chaos, served.url if served is not None else None)
    except Exception as exc:
        emit(
            "vcdl.run.failed",
            str(cfg.run.name),
            {"error": f"{type(exc).__name__}: {exc}", "data": cfg.data.name},
        )
        raise


def _train(
    config: RunConfig, home: str | None, chaos: ChaosSpec | None, metrics_url: str | None
) -> dict[str, Any]:
    logger = get_run_logger()
    # The flow process only merges (memory-bound); the cores are the workers'.
    torch.set_num_threads(1)
    cfg = config.with_locations(resolve_home(home))
    ref, run, resumed = prepare_run(cfg)
    follow_run(ref, cfg)  # the metrics endpoint's figures, from the ledger
    if observe.listened():
        observe.tell(opened(ref, cfg, resumed))
    progress_id = start_progress(ref, cfg.run.epochs, cfg.data.shards)
    with run_lease(ref, logger=logger) as lease:
        # Everything from here on is fenced with the lease's generation: the
        # driver's writes, and its workers' claims (vcdl/ledger/fence.py).
        ref = ref.leased(lease.generation)
        ledger = ref.ledger()
        if resumed:
            removed = clean_orphans(ref)
            logger.info(
                "resuming run %s at epoch %d, head v%d (%d orphan groups removed)",
                ref.run,
                run.epochs_completed,
                run.head_version,
                len(removed),
            )
        ledger.update_run(ref.run, state="running")
        try:
            with (
                # Before the cluster: its nannies log from the IO loop, and a
                # console write that blocks there would stall every result.
                console_off_thread(),
                dask_cluster(cfg) as address,
                preemptions(address, chaos) as chaos_thread,
                shared_task_runner(address) as runner,
            ):
                # One flow object for every epoch: with_options rebuilds the
                # parameters' JSON schema (RunConfig's), and a call validates them
                # again; both are ours, typed, and cost ~0.1 s at every barrier.
                epoch_subflow = epoch_flow.with_options(
                    task_runner=runner,  # type: ignore[arg-type]  # DaskTaskRunner is one
                    flow_run_name=EPOCH_RUN_NAME,
                    validate_parameters=False,
                )
                with epoch_heartbeats_off():
                    # In order; each next epoch's Prefect set-up overlaps the
                    # current one's last results (vcdl/driver/epoch_loop.py).
                    run_epochs(
                        lambda epoch: epoch_subflow(
                            ref,
                            cfg,
                            epoch,
                            final=epoch == cfg.run.epochs - 1,
                            progress_id=progress_id,
                        ),
                        range(run.epochs_completed, cfg.run.epochs),
                    )
                if chaos_thread is not None:
                    logger.warning("preemptions sent: %s", chaos_thread.counts())
        except LeaseLost:
            raise  # the run is another driver's now: nothing more is written
        except (KeyboardInterrupt, TerminationSignal):
            # Ctrl-C, or SIGTERM: vcdl.termination's, or Prefect's own while a flow runs.
            ledger.update_run(ref.run, state="interrupted")
            raise
        except BaseException:
            ledger.update_run(ref.run, state="failed")
            raise
        finally:
            forget_run_cache(ref)  # the head kept across epochs: its memory
        sweep_orphans(ref)
        ledger.update_run(ref.run, state="completed")
    ProgressUpdater(ref, progress_id, cfg.run.epochs, cfg.data.shards)(force=True)
    summary = run_status(ledger, ref.run)
    log = run_log_path(resolve_home(home), ref.run)
    # Written by `vcdl train`/`resume` (vcdl/display.py); a deployment's run has none.
    publish_summary(
        ref, summary, log_file=str(log) if log.exists() else None, metrics_url=metrics_url
    )
    return summary

"""Shard tasks whose Prefect run or Dask future the engines cannot look after themselves.

Two behaviours worked around (Prefect 3.8, prefect-dask 0.3.7, distributed
2026.8; guarded by ``tests/chaos/test_chaos_run.py`` and
``tests/integration/test_train_flow.py``):

* When every worker running a task died (``KilledWorker``), or the driver
  cancels a task (past its deadline, a straggler at the quorum), the task's
  engine is gone or never finishes: Prefect leaves its task run "Running"
  forever. :func:`set_task_run_state` tells Prefect the truth.
* Dask keeps a finished task's result on its worker while a client holds
  the future; a worker killed afterwards made the scheduler run those
  finished tasks again elsewhere ("lose already computed tasks"): Prefect's
  engine and a ledger lookup for each, on the surviving workers, at every
  kill. :func:`release` lets Dask forget a task whose result the driver has
  consumed.

:func:`dask_key` and :func:`runner_done` read the same wrapped future for the
epoch's stall report (``flows/epoch_stall.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.states import Cancelled


def release(future: PrefectFuture[Any]) -> None:
    """Let Dask forget a task whose result the driver has consumed."""
    wrapped = getattr(future, "wrapped_future", None)
    if wrapped is not None:
        wrapped.release()


def cancel(future: PrefectFuture[Any]) -> None:
    """Cancel the task's Dask future (a task already running finishes on its worker)."""
    wrapped = getattr(future, "wrapped_future", None)
    if wrapped is not None:
        wrapped.cancel()


def dask_key(future: PrefectFuture[Any]) -> Any:
    """The Dask key of the future's task (None outside a Dask task runner)."""
    return getattr(getattr(future, "wrapped_future", None), "key", None)


def runner_done(future: PrefectFuture[Any]) -> bool:
    """Whether the future's runner (Dask, a thread pool) has finished its task."""
    wrapped = getattr(future, "wrapped_future", None)
    return bool(wrapped is not None and wrapped.done())


def set_task_run_state(
    future: PrefectFuture[Any], kind: Literal["crashed", "cancelled"], message: str
) -> None:
    """Force the task run's state in Prefect; best effort (the run may not exist yet)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    state: State[Any] = (
        Crashed(message=message) if kind == "crashed" else Cancelled(message=message)
    )
    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(future.task_run_id, state, force=True)
    except Exception:  # the run may not exist (killed in its first second)
        pass

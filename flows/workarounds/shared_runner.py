"""One Dask client for all of a run's epoch subflows.

Works around prefect-dask 0.3.7 (with Prefect 3.8): ``DaskTaskRunner`` opens
a client when a subflow first submits and closes it when the subflow ends,
~0.5 s of every epoch barrier with the workers idle. Guarded by
``tests/integration/test_shared_runner.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect_dask import DaskTaskRunner
from prefect_dask.client import PrefectDaskClient

from flows.workarounds.task_settings import VcdlDaskClient


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
    them once, not at every task (flows/workarounds/task_settings.py); benchmarks pass
    prefect-dask's own as ``client_class`` to compare.
    """
    with client_class(address, set_as_default=False) as client:
        yield SharedClientRunner(client)


def run_dask_client() -> PrefectDaskClient | None:
    """The Dask client the current flow run submits through (vcdl's shared one), or None."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx is not None else None
    return runner.client if isinstance(runner, SharedClientRunner) else None

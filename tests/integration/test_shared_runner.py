"""The epoch subflows share one Dask client: no close and reconnect at each barrier."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task
from prefect_dask import DaskTaskRunner

from flows.workarounds.shared_runner import SharedClientRunner, shared_task_runner
from tests.daskfixture import local_cluster


@task(persist_result=False)
def _where() -> str:
    from distributed import get_worker

    return str(get_worker().address)


@flow
def _epoch_like(n: int) -> list[str]:
    return [f.result() for f in [_where.submit() for _ in range(n)]]


def _clients(client: Any) -> set[str]:
    """Client ids the scheduler knows of, other than the test's own."""
    ids = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.clients))
    return {c for c in ids if c != client.id and c != "fire-and-forget"}


@pytest.mark.usefixtures("prefect_api")
def test_subflows_share_one_client_and_it_closes_with_the_run() -> None:
    with local_cluster(2) as (cluster, client):
        address = cluster.scheduler_address
        seen: list[set[str]] = []
        with shared_task_runner(address) as runner:
            for _ in range(3):
                done = _epoch_like.with_options(task_runner=runner)(2)  # type: ignore[arg-type]
                assert len(done) == 2
                assert set(done) <= set(client.scheduler_info()["workers"])
                seen.append(_clients(client))
            # One client, the runner's, open across the three subflows.
            assert seen[0] == seen[1] == seen[2] and len(seen[0]) == 1, seen
            assert runner.client.id in seen[0]
            assert runner.client.status == "running"
        assert runner.client.status == "closed"


def test_a_pickled_runner_is_a_plain_dask_runner_without_the_client() -> None:
    class _Client:  # stands in for the open client: pickling must never reach it
        class scheduler:
            address = "tcp://127.0.0.1:8786"

        def __reduce__(self) -> Any:
            raise AssertionError("the Dask client was pickled")

    runner = SharedClientRunner(_Client())  # type: ignore[arg-type]
    assert runner.duplicate().client is runner.client
    copy = pickle.loads(pickle.dumps(runner))
    assert type(copy) is DaskTaskRunner and copy.address == "tcp://127.0.0.1:8786"


@task(persist_result=False)
def _settings_seen() -> dict[str, Any]:
    import os

    from prefect.context import SettingsContext, SyncClientContext

    settings = SettingsContext.get().settings
    return {
        "pid": os.getpid(),
        "settings": id(settings),
        "client": id(SyncClientContext.get().client),
        "max_retries": settings.client.max_retries,
        "api": settings.api.url,
    }


@flow
def _settings_epoch(n: int) -> tuple[str, list[dict[str, Any]]]:
    from prefect.runtime import flow_run

    return str(flow_run.id), [_settings_seen.submit().result() for _ in range(n)]


def _task_run_states(flow_run_ids: list[str], expected: int) -> list[str]:
    """The task runs' states as the API has them, once all ``expected`` arrived (events lag)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    ids = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(i) for i in flow_run_ids]))
    states: list[str] = []
    with get_client(sync_client=True) as client:
        for _ in range(60):
            runs = client.read_task_runs(flow_run_filter=ids)
            states = sorted(str(r.state_type.value) for r in runs if r.state_type)
            if states.count("COMPLETED") == expected:
                break
            time.sleep(0.5)
    return states


@pytest.mark.usefixtures("prefect_api")
def test_a_worker_builds_prefects_settings_once_from_the_flows_and_its_own_env() -> None:
    from distributed import LocalCluster
    from prefect.settings import PREFECT_API_URL

    # Set on the worker only: what the flow's settings leave unset comes from
    # the worker's environment, as with prefect-dask's own client; had the
    # settings been built where the scheduler unpickles the task (this
    # process), the worker would see the default, 5.
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            env={"PREFECT_CLIENT_MAX_RETRIES": "7"},
        ) as cluster,
        shared_task_runner(cluster.scheduler_address) as runner,
    ):
        run1, first = _settings_epoch.with_options(task_runner=runner)(3)  # type: ignore[arg-type]
        run2, second = _settings_epoch.with_options(task_runner=runner)(2)  # type: ignore[arg-type]
    seen = first + second
    assert {s["max_retries"] for s in seen} == {7}
    assert {s["api"] for s in seen} == {PREFECT_API_URL.value()}
    assert len({s["pid"] for s in seen}) == 1
    # One Settings for every task of the worker, across subflows: built once;
    # one API client for its (single) thread.
    assert len({s["settings"] for s in seen}) == 1, seen
    assert len({s["client"] for s in seen}) == 1, seen
    # The shared client still reports every task run to the API.
    assert _task_run_states([run1, run2], 5) == ["COMPLETED"] * 5


@pytest.mark.usefixtures("prefect_api")
def test_the_epoch_driver_asks_the_runs_client(tmp_path: Path) -> None:
    """Its client is how the driver learns when a killed attempt's worker died."""
    from flows.epoch import EpochExecutor
    from flows.workarounds.shared_runner import run_dask_client
    from tests.integration.test_failure_modes import make_run

    ref, cfg = make_run(tmp_path)
    assert run_dask_client() is None  # outside a flow run

    with local_cluster(1) as (cluster, _), shared_task_runner(cluster.scheduler_address) as runner:

        @flow
        def drive() -> bool:
            return EpochExecutor(ref, cfg, 0, final=True).dask_client is runner.client

        assert drive.with_options(task_runner=runner)()  # type: ignore[arg-type]

"""The epoch subflows share one Dask client: no close and reconnect at each barrier."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from prefect import flow, task
from prefect_dask import DaskTaskRunner

from flows.cluster import SharedClientRunner, shared_task_runner
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

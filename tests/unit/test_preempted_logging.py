"""A worker under a preemption notice is vcdl working as designed, not an ERROR in the log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from flows.tasks import train_shard
from tests.logrecords import RecordingHandler
from vcdl.config import RunConfig
from vcdl.runtime import RunRef
from vcdl.worker import preemption
from vcdl.worker.runtime import WorkerRuntime


@pytest.fixture
def under_notice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The task runs in this process, outside any Dask worker: it is handed a
    # runtime whose notice was taken, as a worker's after SIGTERM.
    runtime = WorkerRuntime()
    runtime.notice.set()
    monkeypatch.setattr("flows.tasks.current_runtime", lambda: runtime)
    yield


@pytest.mark.usefixtures("prefect_api", "under_notice")
def test_a_preempted_task_logs_no_error_and_is_not_retried(tmp_path: Path) -> None:
    ref = RunRef(run="r", ledger_url=f"sqlite:///{tmp_path}/l.db", store_url=str(tmp_path))
    handler = RecordingHandler()
    prefect_logger = logging.getLogger("prefect")
    prefect_logger.addHandler(handler)

    @flow
    def one_attempt() -> Any:  # the task's own engine, as on a Dask worker
        return train_shard(ref, RunConfig(), 2, 5, None, return_state=True)

    try:
        state = one_attempt()
    finally:
        prefect_logger.removeHandler(handler)
    task_records = [r for r in handler.records if r.name.startswith("prefect.task_runs")]
    assert task_records, "the task engine logged nothing: the handler saw no task run"
    errors = [r.getMessage() for r in task_records if r.levelno >= logging.ERROR]
    assert errors == []
    # No retry spent on a worker whose notice never clears.
    assert not any("Retry" in r.getMessage() for r in task_records)
    assert state.is_completed()
    out = state.result()
    assert out["state"] == preemption.PREEMPTED and out["worker"]

"""A worker under a preemption notice is vcdl working as designed, not an ERROR in the log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from flows.epoch import EpochDriver, train_shard
from tests.logrecords import RecordingHandler
from vcdl import preemption
from vcdl.config import RunConfig
from vcdl.runtime import RunRef


@pytest.fixture
def under_notice() -> Iterator[None]:
    preemption._NOTICE.set()
    try:
        yield
    finally:
        preemption.reset_for_tests()


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


class _Future:
    def __init__(self, out: dict[str, Any]) -> None:
        self.out = out

    def result(self) -> dict[str, Any]:
        return self.out


def test_the_driver_reissues_a_preempted_attempt() -> None:
    driver = EpochDriver.__new__(EpochDriver)
    driver.tally = {"errors": 0, "killed": 0}
    reissued: list[tuple[tuple[int, int], str]] = []
    driver._mark_running_attempts = lambda key, state, reason: 0  # type: ignore[method-assign]
    driver.reissue = lambda key, reason: reissued.append((key, reason))  # type: ignore[method-assign]
    driver._on_done(_Future(preemption.preempted_result("tcp://10.0.0.7:4000")), (2, 5))  # type: ignore[arg-type]
    assert reissued == [((2, 5), "attempt preempted on tcp://10.0.0.7:4000 (preemption notice)")]
    assert driver.tally == {"errors": 1, "killed": 0}  # as for a worker that died

"""A worker under a preemption notice is vcdl working as designed, not an ERROR in the log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prefect import flow

from flows.epoch import FREE_HANDBACKS, EpochDriver, train_shard
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
    driver.handed_back = {}
    reissued: list[tuple[tuple[int, int], str]] = []
    driver._mark_running_attempts = lambda key, state, reason: 0  # type: ignore[method-assign]
    driver.reissue = lambda key, reason: reissued.append((key, reason))  # type: ignore[method-assign]
    driver._on_done(_Future(preemption.preempted_result("tcp://10.0.0.7:4000")), (2, 5))  # type: ignore[arg-type]
    assert reissued == [
        ((2, 5), "handed back untrained by tcp://10.0.0.7:4000, under preemption notice")
    ]
    assert driver.tally == {"errors": 1, "killed": 0}  # as for a worker that died
    assert driver.handed_back == {(2, 5): 1}


def _reissuing_driver(
    attempts: int, rows: list[SimpleNamespace] | None = None
) -> tuple[EpochDriver, list[tuple[int, int]]]:
    """A driver whose subtask (2, 5) has claimed ``attempts`` attempts in the ledger.

    ``rows``: those attempts as the ledger lists them (none killed if not given).
    """
    driver = EpochDriver.__new__(EpochDriver)
    driver.cfg = RunConfig()  # fault.max_attempts = 4
    driver.ref = SimpleNamespace(run="r")  # type: ignore[assignment]
    driver.tally = {"failed": 0, "reissued": 0}
    driver.submitted, driver.handed_back = {}, {}
    failed: list[str] = []
    listed = rows or []
    driver.ledger = SimpleNamespace(  # type: ignore[assignment]
        set_subtask_state=lambda sid, state, reason: failed.append(reason),
        attempts=lambda run, epoch: list(listed),
    )
    driver._subtask = lambda key: SimpleNamespace(  # type: ignore[method-assign]
        id=1, state="pending", attempts=len(listed) or attempts
    )
    driver.log = logging.getLogger("test")  # type: ignore[assignment]
    submitted: list[tuple[int, int]] = []

    def submit(key: tuple[int, int]) -> None:
        driver.submitted[key] = driver.submitted.get(key, 0) + 1
        submitted.append(key)

    driver.submit = submit  # type: ignore[method-assign]
    driver.failed_reasons = failed  # type: ignore[attr-defined]
    return driver, submitted


def test_hand_backs_from_workers_under_notice_are_not_attempts() -> None:
    # One attempt trained and died; then five tasks met workers under notice.
    driver, submitted = _reissuing_driver(attempts=1)
    key = (2, 5)
    driver.submitted[key] = 2  # the one that died, and the first handed back
    for _ in range(5):
        driver.handed_back[key] = driver.handed_back.get(key, 0) + 1
        driver.reissue(key, "handed back untrained by w, under preemption notice")
    assert len(submitted) == 5 and driver.tally == {"failed": 0, "reissued": 5}


def test_hand_backs_count_once_they_spin() -> None:
    """Workers that never leave the pool must not make a subtask reissue forever."""
    driver, submitted = _reissuing_driver(attempts=0)
    key = (2, 5)
    driver.submitted[key] = 1
    while driver.tally["failed"] == 0:
        assert len(submitted) < 100, "reissued without end"
        driver.handed_back[key] = driver.handed_back.get(key, 0) + 1
        driver.reissue(key, "handed back untrained by w, under preemption notice")
    assert driver.submitted[key] == FREE_HANDBACKS + RunConfig().fault.max_attempts
    assert driver.failed_reasons[0].startswith("4 attempts")  # type: ignore[attr-defined]


def test_attempts_that_trained_still_count() -> None:
    driver, submitted = _reissuing_driver(attempts=4)
    driver.submitted[(2, 5)] = 4
    driver.reissue((2, 5), "worker died")
    assert submitted == [] and driver.tally["failed"] == 1


def _killed(number: int, samples: int | None) -> SimpleNamespace:
    return SimpleNamespace(number=number, shard=5, state="killed", samples=samples)


def test_kills_that_moved_the_subtask_forward_do_not_fail_it() -> None:
    # Six kills, each after checkpointing further: a healthy subtask on a busy fleet.
    rows = [_killed(i + 1, 100 * (i + 1)) for i in range(6)]
    driver, submitted = _reissuing_driver(0, rows)
    driver.submitted[(2, 5)] = 2
    driver.reissue((2, 5), "KilledWorker: the workers running it died")
    assert submitted == [(2, 5)] and driver.tally["failed"] == 0


def test_kills_at_the_same_point_fail_it_and_say_so() -> None:
    # One kill moved it forward; four more died at the same checkpoint.
    rows = [_killed(1, 100), *(_killed(i, 100) for i in range(2, 6))]
    driver, submitted = _reissuing_driver(0, rows)
    driver.submitted[(2, 5)] = 2
    driver.reissue((2, 5), "KilledWorker: the workers running it died")
    assert submitted == [] and driver.tally["failed"] == 1
    assert driver.failed_reasons == [  # type: ignore[attr-defined]
        "4 attempts (1 more moved it forward before their workers died), "
        "last: KilledWorker: the workers running it died"
    ]

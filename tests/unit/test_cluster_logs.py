"""A normal Dask shutdown prints no traceback: the benign INFO records are quieted."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from flows.workarounds.dask_logs import BENIGN_INFO_LOGGERS, quiet_benign_logs


@pytest.fixture
def batched() -> Iterator[logging.Logger]:
    logger = logging.getLogger("distributed.batched")
    level = logger.level
    logger.setLevel(logging.INFO)  # as the driver had it: INFO records were shown
    yield logger
    logger.setLevel(level)


def _comm_closed(logger: logging.Logger) -> None:
    # What distributed.batched.BatchedSend logs when a worker's comm closes.
    try:
        raise ConnectionError("CommClosedError")
    except ConnectionError:
        logger.info("Batched Comm Closed %r", "<TCP (closed)>", exc_info=True)


def test_the_shutdown_traceback_is_not_shown_but_warnings_are(
    batched: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    assert "distributed.batched" in BENIGN_INFO_LOGGERS
    with caplog.at_level(logging.DEBUG):
        batched.setLevel(logging.INFO)  # caplog.at_level lowered the root only
        _comm_closed(batched)
        assert "Batched Comm Closed" in caplog.text  # shown before
        caplog.clear()
        quiet_benign_logs()
        _comm_closed(batched)
        batched.warning("a real problem")
    assert "Batched Comm Closed" not in caplog.text and "Traceback" not in caplog.text
    assert "a real problem" in caplog.text


def test_a_stricter_level_set_by_the_user_is_kept(batched: logging.Logger) -> None:
    batched.setLevel(logging.ERROR)
    quiet_benign_logs()
    assert batched.level == logging.ERROR

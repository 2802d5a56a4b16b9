"""How the train flow calls its epoch subflows (flows/train.py)."""

from __future__ import annotations

from prefect.settings import get_current_settings

from flows.train import EPOCH_RUN_NAME
from flows.workarounds.heartbeats import epoch_heartbeats_off
from vcdl.runtime import RunRef


def test_epoch_run_names_come_from_the_subflow_parameters() -> None:
    ref = RunRef(run="nightly", ledger_url="sqlite://", store_url="/tmp/s")
    assert EPOCH_RUN_NAME.format(ref=ref, epoch=3) == "nightly · epoch 3"


def test_heartbeats_are_off_for_the_subflows_only() -> None:
    before = get_current_settings().flows.heartbeat_frequency
    assert before is not None  # Prefect's default: the train flow keeps them
    with epoch_heartbeats_off():
        assert get_current_settings().flows.heartbeat_frequency is None
    assert get_current_settings().flows.heartbeat_frequency == before

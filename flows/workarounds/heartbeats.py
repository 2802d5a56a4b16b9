"""No Prefect heartbeat thread for the epoch subflows.

Works around Prefect 3.8: a subflow's heartbeat thread sleeps in 1-s steps
and Prefect joins it when the subflow ends, up to 1 s of every epoch barrier
with all workers idle. The epoch subflows run in the train flow's process,
whose own run keeps its heartbeats (crash detection). Guarded by
``tests/unit/test_epoch_subflow.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def epoch_heartbeats_off() -> Iterator[None]:
    """No Prefect heartbeat thread for the epoch subflows started inside.

    They run in the train flow's process, whose own run keeps its heartbeats
    (crash detection). A subflow's heartbeat thread sleeps in 1-s steps and
    Prefect joins it when the subflow ends: up to 1 s of every epoch
    barrier, all workers idle.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield

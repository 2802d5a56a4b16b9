"""Dask's routine INFO records kept off the run's console.

Works around distributed 2026.8 logging a normal worker disconnect at INFO
with a full ``CommClosedError`` traceback ("Batched Comm Closed"), which a
user took for a failure at the end of a successful run. Guarded by
``tests/unit/test_cluster_logs.py``.
"""

from __future__ import annotations

import logging

#: Dask loggers whose INFO records are a normal run's routine, or tracebacks
#: of a normal shutdown.
BENIGN_INFO_LOGGERS = (
    "distributed.batched",
    "distributed.scheduler",
    "distributed.core",
    "distributed.nanny",
    "distributed.http.proxy",
)


def quiet_benign_logs() -> None:
    """Raise the loggers of :data:`BENIGN_INFO_LOGGERS` to WARNING.

    When a worker's connection closes (the run ending, a worker retired or
    killed), the scheduler's batched stream logs "Batched Comm Closed" at INFO
    *with a full CommClosedError traceback*: at the end of a successful run a
    user saw a traceback and took it for a failure. The LocalCluster's
    scheduler and nannies live in the driver, and their INFO records (a worker
    registered, a client connected, a stream closed: 41 lines in the README's
    run) buried its progress lines; ``silence_logs`` does not reach them once
    Prefect and vcdl's console own the handlers. Their warnings and errors
    (a worker restarted, a task failed) still show, and a stricter level the
    user set is kept.
    """
    for name in BENIGN_INFO_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)

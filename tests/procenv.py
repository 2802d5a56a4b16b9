"""The environment of a process a fleet test starts (a driver, a ``dask worker``).

The test runner's own environment, less every Prefect, vcdl, Dask and AWS
setting (one leaking in from the runner would decide what the test checks),
with one thread per BLAS pool and unbuffered output, plus the test's own values.
"""

from __future__ import annotations

import os

DROPPED = ("PREFECT_", "VCDL_", "DASK_", "AWS_")


def clean_env(*, drop: tuple[str, ...] = DROPPED, **values: str) -> dict[str, str]:
    """``os.environ`` without the ``drop`` prefixes, then the defaults, then ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1", PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONUNBUFFERED="1")
    env.update(values)
    return env

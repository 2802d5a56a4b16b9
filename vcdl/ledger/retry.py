"""How both ledger engines retry a transient database error: which errors, how often, how long.

Shared by :mod:`vcdl.ledger.engine` (every backend's transactions) and
:mod:`vcdl.ledger.pg` (PostgreSQL's fast path), which import nothing of each
other's, so that the two keep one policy.
"""

from __future__ import annotations

import random
import time
from typing import Final

# PostgreSQL SQLSTATEs after which re-running the whole transaction is correct:
# serialization_failure and deadlock_detected.
TRANSIENT_SQLSTATES: Final = frozenset({"40001", "40P01"})
TRANSIENT_RETRIES: Final = 8

# Jitter from its own generator: the global one is the user's (their seeds,
# their reproducibility), and a driver process shares it with them.
_JITTER = random.Random()


def jitter(low: float, high: float) -> float:
    """A uniform draw in [low, high] that leaves the process's global ``random`` alone."""
    return _JITTER.uniform(low, high)


def transient_pause(attempt: int) -> None:
    """Sleep before retry ``attempt + 1``: jittered, longer with every attempt."""
    time.sleep(jitter(0.005, 0.05) * (attempt + 1))

"""The driver lease: at most one driver advances a run at a time.

A driver takes the run's lease in the ledger (a conditional UPDATE, so two
drivers cannot both win) and renews it in a background thread while it
works; a second driver is refused with the holder's name. A lease left by a
driver on this host that has died is waited out (at most the lease's time to
live) instead of refused, so ``vcdl resume`` right after a crash works.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vcdl.errors import LeaseHeld
from vcdl.runtime import RunRef

LEASE_TTL = 30.0
_log = logging.getLogger(__name__)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _dead_local_owner(owner: str | None) -> bool:
    """True when the lease holder is a process on this host that no longer exists."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@contextmanager
def run_lease(
    ref: RunRef,
    ttl: float = LEASE_TTL,
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
) -> Iterator[str]:
    """Hold the run's lease (renewed in the background) so only one driver runs it.

    ``logger``: where to say that a dead driver's lease is waited out
    (the flow's run logger).

    A lease left by a driver on this host that has died is waited out (at
    most ``ttl`` seconds) instead of refused.
    """
    ledger, owner = ref.ledger(), _owner()
    log = logger if logger is not None else _log
    deadline = time.monotonic() + ttl + 5
    while True:
        try:
            ledger.acquire_lease(ref.run, owner, ttl)
            break
        except LeaseHeld:
            holder = ledger.get_run(ref.run).lease_owner
            if not _dead_local_owner(holder) or time.monotonic() > deadline:
                raise
            log.warning("waiting for the lease of dead driver %s to expire", holder)
            time.sleep(2)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3):
            try:
                ledger.acquire_lease(ref.run, owner, ttl)
            except Exception as exc:  # keep trying; losing it shows at the next renewal
                log.warning("lease renewal failed: %s", exc)

    thread = threading.Thread(target=renew, name="vcdl-lease", daemon=True)
    thread.start()
    try:
        yield owner
    finally:
        stop.set()
        thread.join(timeout=5)
        ledger.release_lease(ref.run, owner)

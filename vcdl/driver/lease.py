"""The driver lease: at most one driver advances a run at a time.

A driver takes the run's lease in the ledger (a conditional UPDATE, so two
drivers cannot both win) and renews it in a background thread while it
works; a second driver is refused with the holder's name. A lease left by a
driver on this host that has died is waited out (at most the lease's time to
live) instead of refused, so ``vcdl resume`` right after a crash works.

The lease is also a fencing token (vcdl/ledger/fence.py): each driver that
takes it gets a new generation, and the ledger refuses every write of a driver
whose generation is no longer the run's. A driver paused past its lease
(SIGSTOP, a VM paused for live migration) cannot write once another has taken
over; it finds out at its next write or renewal and stops.
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
from dataclasses import dataclass
from typing import Any

from vcdl.errors import ConfigError, LeaseHeld, LeaseLost, LedgerNotFound, RunBeingDriven
from vcdl.runtime import RunRef

LEASE_TTL = 30.0
# Seconds a driver's lease lasts unrenewed: how long a resume waits for a
# driver that vanished, and how soon a paused one loses the run.
LEASE_TTL_ENV = "VCDL_LEASE_TTL"


def lease_ttl() -> float:
    """The driver's lease time to live: ``$VCDL_LEASE_TTL`` seconds, else :data:`LEASE_TTL`."""
    raw = os.environ.get(LEASE_TTL_ENV)
    if not raw:
        return LEASE_TTL
    try:
        ttl = float(raw)
    except ValueError:
        ttl = 0.0
    if not 1.0 <= ttl <= 3600.0:
        raise ConfigError(f"{LEASE_TTL_ENV}={raw!r}: give seconds between 1 and 3600 (default 30)")
    return ttl


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


def refuse_live_driver(ledger_url: str, run: str) -> None:
    """Raise :class:`RunBeingDriven` if a live driver holds ``run``'s lease; else nothing.

    For a second ``vcdl train`` or ``resume`` of a running run, before it
    starts Prefect or a cluster (it printed progress for seconds, then failed
    with exit 1). Reads only: a missing ledger or run is a new run; a lease
    that expired, or whose holder is a dead process on this host, is left to
    :func:`run_lease` to take.
    """
    from vcdl.ledger.models import utcnow
    from vcdl.runtime import open_ledger

    try:
        found = open_ledger(ledger_url, create=False).find_run(run)
    except LedgerNotFound:
        return
    if found is None or not found.lease_owner or found.lease_expires is None:
        return
    if found.lease_expires <= utcnow() or _dead_local_owner(found.lease_owner):
        return
    host, _, rest = found.lease_owner.partition(":")
    pid = rest.partition(":")[0]
    who = f"process {pid} on {host}" if pid.isdigit() else found.lease_owner
    raise RunBeingDriven(
        f"run {run!r} is being driven by {who} (lease {found.lease_owner}); wait for it "
        f"to finish (`vcdl status {run}`), or stop it and then `vcdl resume {run}`"
    )


@dataclass(frozen=True)
class Lease:
    """The lease a driver holds: its owner string and its generation (the fencing token)."""

    run: str
    owner: str
    generation: int


@contextmanager
def run_lease(
    ref: RunRef,
    ttl: float | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
) -> Iterator[Lease]:
    """Hold the run's lease (renewed in the background) so only one driver runs it.

    ``ttl``: seconds, default :func:`lease_ttl`. ``logger``: where to say
    that a dead driver's lease is waited out (the flow's run logger).

    A lease left by a driver on this host that has died is waited out (at
    most ``ttl`` seconds) instead of refused. The lease's generation fences
    the driver's writes: use ``ref.leased(lease.generation)`` for everything
    done under it. A renewal that finds the lease gone (this process was
    paused past it and another driver took the run) stops renewing and
    says so in the log; from then on every fenced write is refused, and the
    driver finds out at its next one (or its epoch loop's next poll).
    """
    ttl = lease_ttl() if ttl is None else ttl
    ledger, owner = ref.ledger(fenced=False), _owner()
    log = logger if logger is not None else _log
    deadline = time.monotonic() + ttl + 5
    while True:
        try:
            generation = ledger.acquire_lease(ref.run, owner, ttl)
            break
        except LeaseHeld:
            holder = ledger.get_run(ref.run).lease_owner
            if not _dead_local_owner(holder) or time.monotonic() > deadline:
                raise
            log.warning("waiting for the lease of dead driver %s to expire", holder)
            time.sleep(2)
    lease = Lease(ref.run, owner, generation)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3):
            try:
                ledger.renew_lease(ref.run, owner, generation, ttl)
            except LeaseLost as exc:
                log.error("%s", exc)
                return
            except Exception as exc:  # a ledger that is down: keep trying until it expires
                log.warning("lease renewal failed: %s", exc)

    thread = threading.Thread(target=renew, name="vcdl-lease", daemon=True)
    thread.start()
    try:
        yield lease
    finally:
        stop.set()
        thread.join(timeout=5)
        ledger.release_lease(ref.run, owner)

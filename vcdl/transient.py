"""Transient network errors: the retry policy, the outage log, and the two retry loops.

This module owns how long vcdl keeps trying a call to the store or the ledger
that failed for a reason that will pass (a cut link, a restarted server, a
5xx): bounded exponential backoff with jitter under a total deadline
(:class:`RetryPolicy`, pure), and one log line when an outage of a service
starts and one when it ends, however many calls retried meanwhile
(:class:`Outage`). :func:`retry_call` and :func:`retry_async` run a call under
both; *which* errors are transient is the edge's to say
(:mod:`vcdl.store.s3retry` for S3, :mod:`vcdl.ledger.retry` for PostgreSQL),
because only the edge knows whether a call is safe to repeat. A refusal (a
fencing token, a checksum, a missing key, a permission) is never transient.

The deadline is at least a minute (docs/fault-tolerance.md, "A partition"):
a partition between the driver and its store or ledger of up to 60 s stalls
the merges and then they go on; past the deadline the error is raised as
before.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from vcdl.redact import redact_text

T = TypeVar("T")

log = logging.getLogger("vcdl.transient")

MIN_DEADLINE: Final = 60.0  # seconds; the partition a run must survive
# Retries of a service that never answered the process: about as many as
# botocore's own (turned off for S3: vcdl/store/s3retry.py), 2 s at most.
FIRST_CONTACT_RETRIES: Final = 3


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter under a total deadline.

    The n-th pause (n from 0) is drawn uniformly from ``[d/2, d]`` where
    ``d = min(cap, first * factor**n)``: callers that failed together do not
    retry together, and no pause is shorter than half its step. No retry
    starts past ``deadline`` seconds after the first failure's call began.
    """

    first: float = 0.25
    factor: float = 2.0
    cap: float = 8.0
    deadline: float = 90.0

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.cap and self.factor >= 1 and self.deadline > 0):
            raise ValueError(f"retry policy out of range: {self}")

    def pause(self, n: int, rng: random.Random) -> float:
        """The pause before retry ``n + 1`` (``n`` retries done so far)."""
        step = min(self.cap, self.first * self.factor ** min(n, self._steps_to_cap))
        return rng.uniform(step / 2, step)

    @property
    def _steps_to_cap(self) -> int:
        # The power of a large n would overflow; past this many steps it is the cap.
        if self.factor == 1:
            return 0
        return max(0, math.ceil(math.log(self.cap / self.first, self.factor)) + 1)

    def next_pause(self, n: int, elapsed: float, rng: random.Random) -> float | None:
        """The pause before retry ``n + 1`` when ``elapsed`` seconds have passed since the
        call first began, or None: give up (the retry would start past the deadline)."""
        pause = self.pause(n, rng)
        return None if elapsed + pause > self.deadline else pause


DEFAULT_POLICY: Final = RetryPolicy()

# Jitter from its own generator: the global one is the user's (their seeds).
_RNG = random.Random()


class Outage:
    """Whether a service is failing now, so that an outage is logged once, not per call.

    ``name`` says which service (``store s3://bucket``, ``ledger postgresql://…``,
    already redacted). Thread-safe: the driver's merge, its lease renewal and
    Zarr's I/O loop fail together.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self.since: float | None = None
        self.retried = 0
        self.outages = 0
        # Whether the service ever answered this process: until it has, a
        # failure is more likely a wrong address or a missing certificate
        # than an outage, and waiting a minute to say so helps nobody.
        self.answered = False

    def may_retry(self, n: int) -> bool:
        """Whether a call that failed transiently after ``n`` retries may be retried at all
        (the policy's deadline aside): always, once the service has answered this process;
        before, only :data:`FIRST_CONTACT_RETRIES` times (a blip, not a minute)."""
        return self.answered or n < FIRST_CONTACT_RETRIES

    def failed(
        self, error: BaseException, policy: RetryPolicy, *, began: float, tries: int
    ) -> None:
        """A call that began at ``began`` failed transiently for the ``tries``-th time and
        will be retried. Its second failure starts an outage, logged: one failure alone is
        a blip (a pooled connection the server had closed), retried without a word."""
        with self._lock:
            self.retried += 1
            if self.since is not None or tries < 2 or not self.answered:
                return
            self.since, self.outages = began, self.outages + 1
        log.warning(
            "%s unreachable (%s: %s); retrying with backoff for up to %.0f s",
            self.name,
            type(error).__name__,
            _short(error),
            policy.deadline,
        )

    def succeeded(self, now: float) -> None:
        """A call went through: log if this ends an outage."""
        self.answered = True
        if self.since is None and not self.retried:  # the common case, without the lock
            return
        with self._lock:
            since, retried = self.since, self.retried
            self.since, self.retried = None, 0
        if since is not None:
            log.warning(
                "%s reachable again after %.1f s (%d calls retried)",
                self.name,
                now - since,
                retried,
            )


_OUTAGES: dict[str, Outage] = {}
_OUTAGES_LOCK = threading.Lock()


def outage(name: str) -> Outage:
    """The process's one :class:`Outage` of service ``name``."""
    with _OUTAGES_LOCK:
        return _OUTAGES.setdefault(name, Outage(name))


def retry_call(
    call: Callable[[], T],
    transient: Callable[[BaseException], bool],
    service: Outage,
    policy: RetryPolicy = DEFAULT_POLICY,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random = _RNG,
) -> T:
    """``call()``, repeated after each error ``transient`` accepts until ``policy`` gives up.

    A service that never answered this process is retried only
    :data:`FIRST_CONTACT_RETRIES` times, without a log line.
    """
    start = clock()
    n = 0
    while True:
        try:
            result = call()
        except Exception as exc:
            pause = _pause(exc, transient, service, policy, n, clock() - start, rng)
            if pause is None:
                raise
            n += 1
            service.failed(exc, policy, began=start, tries=n)
            sleep(pause)
            continue
        service.succeeded(clock())
        return result


async def retry_async(
    call: Callable[[], Awaitable[T]],
    transient: Callable[[BaseException], bool],
    service: Outage,
    policy: RetryPolicy = DEFAULT_POLICY,
    *,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random = _RNG,
) -> T:
    """:func:`retry_call` for a coroutine: the pauses leave the event loop free."""
    start = clock()
    n = 0
    while True:
        try:
            result = await call()
        except Exception as exc:
            pause = _pause(exc, transient, service, policy, n, clock() - start, rng)
            if pause is None:
                raise
            n += 1
            service.failed(exc, policy, began=start, tries=n)
            await asyncio.sleep(pause)
            continue
        service.succeeded(clock())
        return result


def _pause(
    error: BaseException,
    transient: Callable[[BaseException], bool],
    service: Outage,
    policy: RetryPolicy,
    n: int,
    elapsed: float,
    rng: random.Random,
) -> float | None:
    if not service.may_retry(n) or not transient(error):
        return None
    return policy.next_pause(n, elapsed, rng)


def _short(error: BaseException) -> str:
    # One line: botocore and psycopg messages span several.
    text = " ".join(redact_text(str(error)).split())
    return text if len(text) <= 160 else text[:157] + "..."

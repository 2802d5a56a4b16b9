"""What a run's driver tells listeners in its own process as the run goes (the CLI's display).

The flows call :func:`tell` with plain frozen events; whoever registered with
:func:`listening` (the terminal display of ``vcdl train``) gets each one,
synchronously, in the driver's thread. A listener must only record the event
and return: it may never write to a terminal or wait, so that a stalled
console cannot stall the driver (vcdl/console.py has the same rule for log
handlers). A listener that raises is dropped from that event, never fails the run.
With nobody listening (a deployment, the Python API) :func:`tell` costs a
list check.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunOpened:
    """The driver holds the run: where it stands and what earlier sessions saw."""

    run: str
    epochs: int
    shards: int
    epochs_completed: int
    head_version: int
    kills: int = 0
    reissues: int = 0
    rejections: int = 0


@dataclass(frozen=True)
class EpochProgress:
    """An epoch's state machine after an event: shards finished and what it counted."""

    epoch: int
    shards: int
    done: int
    """Subtasks of this epoch finished: merged, failed, dropped or deferred."""
    tally: Mapping[str, int] = field(default_factory=dict)
    """:meth:`vcdl.driver.epoch_state.EpochState.counts` of this epoch."""


@dataclass(frozen=True)
class Merged:
    """A result was merged: the head is now ``version``."""

    epoch: int
    shard: int
    version: int


@dataclass(frozen=True)
class Evaluated:
    """The head at an epoch's barrier was evaluated on the test split."""

    epoch: int
    version: int
    metrics: Mapping[str, float]
    headline: str | None = None


@dataclass(frozen=True)
class EpochPassed:
    """An epoch passed its barrier."""

    epoch: int
    head_version: int
    seconds: float


RunEvent = RunOpened | EpochProgress | Merged | Evaluated | EpochPassed
Listener = Callable[[RunEvent], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def listened() -> bool:
    """True when someone listens: events worth building."""
    return bool(_listeners)


def tell(event: RunEvent) -> None:
    """Hand ``event`` to every listener; a listener's error is its own."""
    for listener in list(_listeners):
        with contextlib.suppress(Exception):  # a display's bug must not fail a run
            listener(event)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Register ``listener`` for the block."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

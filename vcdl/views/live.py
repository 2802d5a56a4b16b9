"""What the terminal shows while a run trains, as a pure model: run events in, fields out.

:class:`LiveModel` is told the driver's events (:mod:`vcdl.views.observe`)
with the time they were seen and answers with :class:`LiveFields`: the
epoch and its shards, the head, the objective's latest metrics, kills,
reissues and rejections so far, the time elapsed and an estimate of the
time left. :func:`plain_line` writes the fields as one line without control
characters (a pipe, a CI log); :class:`PlainPacer` says when such a line is
worth writing. The rich rendering for a terminal is ``vcdl/display.py``;
nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from vcdl.views.epochs import format_metrics
from vcdl.views.observe import (
    EpochPassed,
    EpochProgress,
    Evaluated,
    Merged,
    RunEvent,
    RunOpened,
)


@dataclass(frozen=True)
class LiveFields:
    """One render of the display."""

    run: str
    epoch: int | None
    """The epoch shown (0-based), None before the first one opens."""
    epochs: int
    done: int
    """Shards of :attr:`epoch` finished."""
    shards: int
    head_version: int | None
    metrics: str | None
    """The latest evaluation, e.g. ``"accuracy 0.9028, loss 0.3100 (epoch 1)"``."""
    kills: int
    reissues: int
    rejections: int
    elapsed: float
    left: float | None
    """Seconds still to go, estimated from the pace so far; None until there is a pace."""
    finished: bool = False


@dataclass
class _Epoch:
    done: int = 0
    shards: int = 0
    tally: Mapping[str, int] = field(default_factory=dict)
    passed: bool = False


@dataclass
class LiveModel:
    """The display's state; feed it with :meth:`handle`, read it with :meth:`fields`."""

    started: float
    """When the command started (same clock as every ``now``)."""
    run: str = ""
    epochs: int = 0
    shards: int = 0
    head_version: int | None = None
    base_kills: int = 0
    base_reissues: int = 0
    base_rejections: int = 0
    first_done: int = 0
    """Shards finished before this driver took the run."""
    work_since: float | None = None
    """When this driver began training (its first epoch opened): the pace's start."""
    metrics: str | None = None
    epoch_of: dict[int, _Epoch] = field(default_factory=dict)
    completed: int = 0
    """Epochs that passed their barrier."""

    def handle(self, event: RunEvent, now: float) -> bool:
        """Take ``event`` in; True when a milestone (an epoch end, an evaluation) came."""
        match event:
            case RunOpened():
                self.run, self.epochs, self.shards = event.run, event.epochs, event.shards
                self.head_version = event.head_version
                self.completed = event.epochs_completed
                self.first_done = event.epochs_completed * event.shards
                self.base_kills, self.base_reissues = event.kills, event.reissues
                self.base_rejections = event.rejections
            case EpochProgress():
                if self.work_since is None:
                    self.work_since = now
                e = self.epoch_of.setdefault(event.epoch, _Epoch())
                e.done, e.shards, e.tally = event.done, event.shards, dict(event.tally)
                if not self.shards:
                    self.shards = event.shards
            case Merged():
                self.head_version = max(self.head_version or 0, event.version)
            case Evaluated():
                text = format_metrics(dict(event.metrics), event.headline)
                self.metrics = f"{text} (epoch {event.epoch})"
                return True
            case EpochPassed():
                e = self.epoch_of.setdefault(event.epoch, _Epoch(shards=self.shards))
                e.passed = True
                e.done = max(e.done, e.shards)
                self.completed = max(self.completed, event.epoch + 1)
                self.head_version = max(self.head_version or 0, event.head_version)
                return True
        return False

    def _current(self) -> int | None:
        """The newest epoch opened, else the next one to run."""
        if self.epoch_of:
            return max(self.epoch_of)
        return min(self.completed, self.epochs - 1) if self.epochs else None

    def _done_units(self) -> int:
        """Shards finished over the run: passed epochs whole, open ones as counted."""
        units = self.completed * self.shards
        for n, e in self.epoch_of.items():
            if n >= self.completed and not e.passed:
                units += min(e.done, e.shards or self.shards)
        return units

    def left(self, now: float) -> float | None:
        """Seconds to go at this driver's pace (shards per second since it began training)."""
        total = self.epochs * self.shards
        units = self._done_units()
        if self.completed >= self.epochs and self.epochs:
            return 0.0
        gained = units - self.first_done
        if self.work_since is None or gained <= 0 or total <= 0:
            return None
        rate = gained / max(now - self.work_since, 1e-6)
        return max(0.0, (total - units) / rate)

    def fields(self, now: float) -> LiveFields:
        """The render as of ``now``."""
        epoch = self._current()
        e = self.epoch_of.get(epoch) if epoch is not None else None
        tally: dict[str, int] = {}
        for one in self.epoch_of.values():
            for k, v in one.tally.items():
                tally[k] = tally.get(k, 0) + v
        return LiveFields(
            run=self.run,
            epoch=epoch,
            epochs=self.epochs,
            done=e.done if e is not None else 0,
            shards=(e.shards if e is not None and e.shards else self.shards),
            head_version=self.head_version,
            metrics=self.metrics,
            kills=self.base_kills + tally.get("killed", 0) + tally.get("timeouts", 0),
            reissues=self.base_reissues + tally.get("reissued", 0),
            rejections=self.base_rejections + tally.get("rejected", 0),
            elapsed=max(0.0, now - self.started),
            left=self.left(now),
            finished=bool(self.epochs) and self.completed >= self.epochs,
        )


def clock(seconds: float | None) -> str:
    """``"42s"``, ``"3:05"``, ``"1:02:03"``; ``"-"`` for unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def counts_text(f: LiveFields) -> str:
    return f"kills {f.kills}, reissues {f.reissues}, rejections {f.rejections}"


def time_text(f: LiveFields) -> str:
    left = "done" if f.finished else f"~{clock(f.left)} left" if f.left is not None else "- left"
    return f"{clock(f.elapsed)} elapsed, {left}"


def plain_line(f: LiveFields) -> str:
    """The fields as one plain line (printable ASCII and '·' only)."""
    if f.epoch is None:
        return f"run {f.run}: starting · {clock(f.elapsed)} elapsed"
    head = f"v{f.head_version}" if f.head_version is not None else "-"
    return (
        f"epoch {f.epoch + 1}/{f.epochs} · shards {f.done}/{f.shards} · head {head} · "
        f"test {f.metrics or '-'} · {counts_text(f)} · {time_text(f)}"
    )


def _state(f: LiveFields) -> tuple[object, ...]:
    """What a plain line says, but the clock: a change worth a new line."""
    return (f.epoch, f.done, f.shards, f.head_version, f.metrics, f.kills, f.reissues,
            f.rejections, f.finished)  # fmt: skip


@dataclass
class PlainPacer:
    """When a plain line is due: a milestone at once, a change at most every
    ``interval`` s, and a heartbeat every ``quiet`` s when nothing changes."""

    interval: float = 5.0
    quiet: float = 60.0
    _last_at: float | None = None
    _last_state: tuple[object, ...] | None = None

    def due(self, f: LiveFields, now: float, milestone: bool = False, last: bool = False) -> bool:
        """Whether to write ``f`` now; ``last``: the final line, written if it says more."""
        state = _state(f)
        if last:
            ok = state != self._last_state
        elif self._last_at is None or milestone:
            ok = True
        elif state != self._last_state:
            ok = now - self._last_at >= self.interval
        else:
            ok = now - self._last_at >= self.quiet
        if ok:
            self._last_at, self._last_state = now, state
        return ok

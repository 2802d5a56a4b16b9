"""Preemption simulator: takes Dask workers away the way spot fleets do.

Two kinds of event, at the times of a seeded Poisson process:

- **kill**: SIGKILL of a worker process, no notice (a spot VM reclaimed
  without warning, a machine unplugged);
- **notice**: SIGTERM, then SIGKILL after a grace period (AWS gives two
  minutes, GCP thirty seconds, Kubernetes ``terminationGracePeriodSeconds``;
  scaled down for tests). A vcdl worker that gets the notice stops its attempt
  at the next batch boundary and hands in a partial result
  (:mod:`vcdl.worker.preemption`).

Signals are delivered through ``Client.run`` inside the chosen worker
process, so the simulator works against local and remote workers alike. The
cluster replaces what it loses the way a fleet would: a LocalCluster's nanny
restarts the worker process; on a real fleet a new instance joins.

The schedule is pure (:func:`chaos_schedule`); :class:`Preemptor` carries it
out in a thread and logs every event with its time. :class:`ScheduledKiller`
carries out a kill schedule against any local processes from a time zero the
caller marks, so that different systems can be given identical kills
(benchmarks/time_to_accuracy.py).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

# The simulator's options' ranges, for the CLI and the flows' form alike.
MAX_RATE = 100.0  # events per second
MAX_GRACE = 3600.0  # seconds from notice to kill
MAX_START = 86400.0  # seconds from the cluster's start to the first event
# A run's first event waits this long by default: its cluster is up and working.
DEFAULT_START = 5.0

EventKind = Literal["kill", "notice"]


@dataclass(frozen=True)
class ChaosEvent:
    """One planned event: when (seconds from start) and what."""

    at: float
    kind: EventKind


@dataclass
class ChaosRecord:
    """One event as carried out."""

    at: float
    kind: EventKind
    worker: str
    pid: int | None
    outcome: str


def chaos_schedule(
    rate: float,
    duration: float,
    seed: int,
    notice_fraction: float = 0.25,
    start_after: float = 0.0,
) -> list[ChaosEvent]:
    """Event times of a Poisson process of ``rate`` events per second.

    Each event is a notice with probability ``notice_fraction``, else a kill.
    """
    if rate < 0 or duration < 0 or not 0.0 <= notice_fraction <= 1.0:
        raise ValueError("rate and duration must be >= 0 and notice_fraction in [0, 1]")
    rng = random.Random(seed)
    events: list[ChaosEvent] = []
    t = start_after
    if rate == 0:
        return events
    while True:
        t += rng.expovariate(rate)
        if t > start_after + duration:
            return events
        kind: EventKind = "notice" if rng.random() < notice_fraction else "kill"
        events.append(ChaosEvent(round(t, 3), kind))


def sent_counts(log_path: str | Path) -> dict[str, int]:
    """Kills and notices a simulator's JSON-lines log (``--preempt-log``) says were sent."""
    counts = {"kill": 0, "notice": 0}
    path = Path(log_path)
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("outcome") == "sent":
                counts[record["kind"]] += 1
    return counts


def _signal_self(signum: int) -> int:
    """Runs inside the worker: send ``signum`` to this very process."""
    pid = os.getpid()
    os.kill(pid, signum)
    return pid


def _pid() -> int:
    return os.getpid()


def _is_local(worker: str) -> bool:
    host = worker.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", socket.gethostname())


def _deliver(client: Any, worker: str, pid: int, sig: int) -> None:
    """Signal a worker process: directly when it is on this host, else from inside it."""
    if _is_local(worker):
        os.kill(pid, sig)
        return
    try:
        client.run(_signal_self, int(sig), workers=[worker])
    except Exception:
        # SIGKILL takes the worker down before it can answer: that is success.
        if sig != signal.SIGKILL:
            raise


class Preemptor(threading.Thread):
    """Carries out a chaos schedule against the workers of a Dask scheduler."""

    def __init__(
        self,
        scheduler_address: str,
        events: list[ChaosEvent],
        grace: float = 2.0,
        seed: int = 0,
        log_path: str | Path | None = None,
        min_workers: int = 1,
    ) -> None:
        super().__init__(name="vcdl-preemptor", daemon=True)
        self.address = scheduler_address
        self.events = events
        self.grace = grace
        self.rng = random.Random(seed)
        self.log_path = Path(log_path) if log_path else None
        self.min_workers = min_workers
        self.records: list[ChaosRecord] = []
        self._stop_event = threading.Event()
        # Worker processes already under notice: a cloud warns an instance
        # once, and a second notice to one would count a notice that took
        # nothing away.
        self._noticed: set[int] = set()

    def stop(self) -> None:
        self._stop_event.set()

    def counts(self) -> dict[str, int]:
        out = {"kill": 0, "notice": 0}
        for r in self.records:
            if r.outcome == "sent":
                out[r.kind] += 1
        return out

    def _record(self, rec: ChaosRecord) -> None:
        self.records.append(rec)
        log.warning(
            "chaos: %s %s (pid %s) at %.1fs: %s", rec.kind, rec.worker, rec.pid, rec.at, rec.outcome
        )
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"time": time.time(), **asdict(rec)}) + "\n")

    def run(self) -> None:
        from distributed import Client

        start = time.monotonic()
        # One client for the thread and the notices' finishers, closed when
        # the thread ends: stop() and a join() close it before the caller
        # closes the cluster (a client left open reconnects to the closed
        # scheduler and logs tracebacks after a successful run).
        # Not Dask's default client: the run's driver must find what it needs
        # through its own (flows/cluster.py), as it does without a simulator.
        with Client(self.address, timeout=30, set_as_default=False) as client:
            for event in self.events:
                delay = event.at - (time.monotonic() - start)
                if delay > 0 and self._stop_event.wait(delay):
                    return
                if self._stop_event.is_set():
                    return
                self._fire(client, event, time.monotonic() - start)
            # The last notices' finishers still need the client.
            self._stop_event.wait(self.grace + 1)

    def _fire(self, client: object, event: ChaosEvent, now: float) -> None:
        from distributed import Client

        assert isinstance(client, Client)
        try:
            pids: dict[str, int] = client.run(_pid)
        except Exception as exc:  # the cluster is between workers: skip this one
            self._record(ChaosRecord(now, event.kind, "-", None, f"skipped: {exc}"))
            return
        if len(pids) < self.min_workers:
            self._record(ChaosRecord(now, event.kind, "-", None, "skipped: no worker"))
            return
        worker = self.pick(pids, event.kind)
        if worker is None:
            self._record(ChaosRecord(now, event.kind, "-", None, "skipped: all under notice"))
            return
        pid = pids[worker]
        sig = signal.SIGKILL if event.kind == "kill" else signal.SIGTERM
        try:
            _deliver(client, worker, pid, sig)
        except Exception as exc:
            self._record(ChaosRecord(now, event.kind, worker, pid, f"failed: {exc}"))
            return
        self._record(ChaosRecord(now, event.kind, worker, pid, "sent"))
        if event.kind == "notice":
            self._noticed.add(pid)
            timer = threading.Timer(self.grace, self._finish_notice, args=(client, worker, pid))
            timer.daemon = True
            timer.start()

    def pick(self, pids: Mapping[str, int], kind: EventKind) -> str | None:
        """The worker an event hits: any for a kill, one not yet under notice for a notice."""
        candidates = sorted(
            w for w, pid in pids.items() if kind == "kill" or pid not in self._noticed
        )
        return self.rng.choice(candidates) if candidates else None

    def _finish_notice(self, client: Any, worker: str, pid: int) -> None:
        """The grace period is over: the instance goes away."""
        if self._stop_event.is_set():
            return
        try:
            # A worker already gone (killed during its grace period) is not
            # asked: Client.run on an address nobody listens at waits out the
            # 30-s connect timeout.
            if worker not in client.scheduler_info(n_workers=-1).get("workers", {}):
                return
            if client.run(_pid, workers=[worker]).get(worker) == pid:
                _deliver(client, worker, pid, signal.SIGKILL)
        except Exception:  # already gone, or the client closed at stop(): nothing to finish
            pass


class ScheduledKiller(threading.Thread):
    """SIGKILLs local processes at fixed offsets from a time zero the caller sets.

    :class:`Preemptor` starts its clock when it starts and talks to a Dask
    scheduler; this one is for comparisons where several systems must suffer
    *the same* kills at the same seconds after *their own* time zero (the
    first dispatch of training work): the clock starts at :meth:`start_clock`
    and ``victims`` (label -> pid, e.g. :func:`dask_worker_pids` or the
    training processes under a ``torchrun`` agent) says who can be hit. An
    event fires only while at least ``min_victims`` are up — a machine that is
    already down cannot be taken again — else it is recorded as skipped. The
    victim is a seeded choice among the sorted labels, so two runs with the
    same seed and the same victim count pick the same positions.
    """

    def __init__(
        self,
        events: list[ChaosEvent],
        victims: Callable[[], Mapping[str, int]],
        *,
        seed: int = 0,
        min_victims: int = 1,
        log_path: str | Path | None = None,
    ) -> None:
        super().__init__(name="vcdl-scheduled-killer", daemon=True)
        if any(e.kind != "kill" for e in events):
            raise ValueError("ScheduledKiller only carries out kills (no notices)")
        self.events = sorted(events, key=lambda e: e.at)
        self.victims = victims
        self.rng = random.Random(seed)
        self.min_victims = min_victims
        self.log_path = Path(log_path) if log_path else None
        self.records: list[ChaosRecord] = []
        self.t0: float | None = None  # time.time() of time zero
        self._clock = threading.Event()
        self._stop_event = threading.Event()

    def start_clock(self, t0: float | None = None) -> None:
        """Time zero is ``t0`` (``time.time()``; default now); only the first call counts."""
        if self.t0 is None:
            self.t0 = time.time() if t0 is None else t0
            self._clock.set()

    def stop(self) -> None:
        self._stop_event.set()
        self._clock.set()

    def kills(self) -> int:
        return sum(1 for r in self.records if r.outcome == "sent")

    def _record(self, rec: ChaosRecord) -> None:
        self.records.append(rec)
        log.warning(
            "chaos: kill %s (pid %s) at %.1fs: %s", rec.worker, rec.pid, rec.at, rec.outcome
        )
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"time": time.time(), **asdict(rec)}) + "\n")

    def run(self) -> None:
        self._clock.wait()
        for event in self.events:
            if self._stop_event.is_set() or self.t0 is None:
                return
            delay = self.t0 + event.at - time.time()
            if delay > 0 and self._stop_event.wait(delay):
                return
            self._fire(event)

    def _fire(self, event: ChaosEvent) -> None:
        try:
            # A process already SIGKILLed can linger (a zombie, or a Dask worker
            # the scheduler has not yet removed): it is down, not a victim. A
            # benchmark run once "killed" the same worker twice in 7 ms.
            killed = {r.pid for r in self.records if r.outcome == "sent"}
            up = {label: pid for label, pid in self.victims().items() if pid not in killed}
        except Exception as exc:  # between processes: nobody to hit
            self._record(ChaosRecord(event.at, "kill", "-", None, f"skipped: {exc}"))
            return
        if len(up) < self.min_victims:
            self._record(ChaosRecord(event.at, "kill", "-", None, f"skipped: {len(up)} up"))
            return
        label = self.rng.choice(sorted(up))
        pid = up[label]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            self._record(ChaosRecord(event.at, "kill", label, pid, "skipped: already gone"))
            return
        self._record(ChaosRecord(event.at, "kill", label, pid, "sent"))


def _scheduler_worker_pids(dask_scheduler: Any) -> dict[str, int]:
    """Runs in the scheduler: the pid each registered worker reported."""
    return {addr: int(ws.pid) for addr, ws in dask_scheduler.workers.items() if ws.pid}


def dask_worker_pids(client: Any) -> dict[str, int]:
    """Address -> pid of the worker processes (not the nannies) the scheduler has registered.

    Asks the scheduler only: ``client.run`` would wait on a worker that is
    dying or restarting, and a kill schedule must not be held up by it.
    """
    pids: dict[str, int] = client.run_on_scheduler(_scheduler_worker_pids)
    return pids

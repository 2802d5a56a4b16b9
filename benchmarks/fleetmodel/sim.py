"""The discrete-event simulation of one run: slots, the driver, K mergers, the shared cores.

Pure: a heapq event queue and per-attempt draws seeded from ``(seed, epoch,
shard, try)``, no I/O, no clock. :func:`simulate` runs the shape
``benchmarks/fleet.py`` runs (``epochs`` epochs of ``shards_per_worker`` × N
shards, all of an epoch's shards queued at once, the epoch barrier) and
returns its utilization as that benchmark defines it: Σ training seconds of
merged attempts ÷ (N × wall), wall from the first submission to the last
merge.

One attempt, as vcdl runs it (``vcdl/worker/attempt.py``):

1. Prefect's task engine asks the API server to create and start the task
   run: a FIFO station of one server (the API server is one process);
2. the worker waits for its own previous result's merge, at most
   ``own_merge_wait_s`` (``vcdl/worker/slots.py``'s ``OWN_MERGE_WAIT``);
3. the claim and the base's read: half of the worker's CPU seconds, and
   the ledger server's for the attempt (PostgreSQL serves its connections
   side by side: no queue);
4. training: the attempt's time, drawn; a preemption (exponential, per
   slot) loses it, the slot comes back after ``replace_s`` and the shard
   goes back to the front of the queue;
5. the result's write and the engine's end: the other half of the worker's
   CPU seconds; the slot is then free;
6. the driver process records the result (ledger, Dask scheduler, flow
   engine): a FIFO station of one server;
7. the merge: one result at a time (one head, one compare-and-swap), cut
   into K ranges merged side by side (``merge_s`` ÷ K each), then
   ``publish_s`` to gather the K checksums and move the head (K > 1 only).

Where the CPU runs: with ``shared_cores`` set (the measuring machine: the
simulated workers, the driver, the API server and the merge on 2 cores),
every CPU demand above is a job of one processor-sharing pool: n jobs each
progress at min(1, cores ÷ n). With ``shared_cores`` None (a fleet), each
worker's demand runs on its own machine and the driver's, API server's and
each merger's on a core of their own, at full speed.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Costs", "Fleet", "Outcome", "simulate"]

Callback = Callable[[], None]


@dataclass(frozen=True)
class Costs:
    """Seconds of work per attempt, per result and per merge (CPU seconds at one full core)."""

    worker_cpu_s: float  # claim, base read, result write, engine: per attempt, model-size free
    worker_cpu_s_per_gb: float  # the same, per GB of float32 model (base read + result write)
    api_s: float  # the Prefect API server's work for one task run
    driver_s: float  # the driver process's work for one result (ledger, scheduler, flow)
    ledger_s: float  # the ledger's server for one attempt (claim and merge); never serial
    merge_s: float  # one whole-model merge by one merger
    publish_s: float = 0.0  # K > 1: gather the K ranges' checksums, one compare-and-swap
    barrier_s: float = 0.0  # between an epoch's last merge and the next epoch's release
    own_merge_wait_s: float = 1.0
    worker_cv: float = 0.0  # spread of the worker's CPU seconds an attempt (gamma); 0: fixed


@dataclass(frozen=True)
class Fleet:
    """The run's shape and the fleet that runs it."""

    workers: int
    attempt_s: float
    model_gb: float
    mergers: int = 1
    shared_cores: float | None = None  # None: every worker on a machine of its own
    attempt_cv: float = 0.0  # lognormal spread of an attempt's time; 0: fixed
    preempt_per_hour: float = 0.0  # per slot, while training
    replace_s: float = 60.0  # a preempted slot's absence
    epochs: int = 2
    shards_per_worker: int = 2
    seed: int = 0


@dataclass(frozen=True)
class Outcome:
    """What one simulated run measured."""

    utilization: float  # Σ training seconds of merged attempts ÷ (N × wall)
    wall_s: float
    merged: int
    preempted: int
    merges_per_s: float
    mean_overhead_s: float  # per merged attempt: its slot's seconds besides training


class _Clock:
    """The event queue: callbacks at times, in time order, ties in insertion order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callback]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callback) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def run(self) -> None:
        while self._heap:
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()


class _SharedCores:
    """Processor sharing on ``cores``: n jobs each run at min(1, cores ÷ n).

    Every job progresses at the same rate, so one virtual clock ``v`` (work
    done by any job since the start) orders their ends: a job of demand d
    added at v0 ends when v reaches v0 + d.
    """

    def __init__(self, clock: _Clock, cores: float) -> None:
        self._clock, self._cores = clock, cores
        self._v, self._t = 0.0, 0.0
        self._jobs: list[tuple[float, int, Callback]] = []
        self._seq = itertools.count()
        self._gen = 0

    def _rate(self) -> float:
        return min(1.0, self._cores / len(self._jobs)) if self._jobs else 0.0

    def _advance(self) -> None:
        now = self._clock.now
        self._v += (now - self._t) * self._rate()
        self._t = now

    def _reschedule(self) -> None:
        self._gen += 1
        if self._jobs:
            gen = self._gen
            dt = max(0.0, self._jobs[0][0] - self._v) / self._rate()
            self._clock.at(self._clock.now + dt, lambda: self._complete(gen))

    def run(self, demand: float, done: Callback) -> None:
        if demand <= 0:
            self._clock.at(self._clock.now, done)
            return
        self._advance()
        heapq.heappush(self._jobs, (self._v + demand, next(self._seq), done))
        self._reschedule()

    def _complete(self, gen: int) -> None:
        if gen != self._gen:
            return  # the pool changed since this end was planned
        self._advance()
        while self._jobs and self._jobs[0][0] <= self._v + 1e-9:
            _, _, done = heapq.heappop(self._jobs)
            self._clock.at(self._clock.now, done)
        self._reschedule()


class _OwnCores:
    """A machine of its own for each job: demand seconds, at full speed."""

    def __init__(self, clock: _Clock) -> None:
        self._clock = clock

    def run(self, demand: float, done: Callback) -> None:
        self._clock.at(self._clock.now + max(0.0, demand), done)


_Cpu = _SharedCores | _OwnCores


class _Station:
    """A FIFO queue in front of ``servers`` servers whose work runs on ``cpu``."""

    def __init__(self, cpu: _Cpu, servers: int = 1) -> None:
        self._cpu, self._servers = cpu, servers
        self._queue: deque[tuple[float, Callback]] = deque()
        self._busy = 0

    def submit(self, demand: float, done: Callback) -> None:
        self._queue.append((demand, done))
        self._start()

    def _start(self) -> None:
        while self._busy < self._servers and self._queue:
            demand, done = self._queue.popleft()
            self._busy += 1
            self._cpu.run(demand, lambda done=done: self._finish(done))  # type: ignore[misc]

    def _finish(self, done: Callback) -> None:
        self._busy -= 1
        done()
        self._start()


@dataclass
class _Result:
    train_s: float
    merged: bool = False
    waiters: list[Callback] | None = None


class _Run:
    """One run's state; :func:`simulate` builds it, runs the clock and reads it."""

    def __init__(self, fleet: Fleet, costs: Costs) -> None:
        if fleet.workers < 1 or fleet.mergers < 1 or fleet.attempt_s <= 0:
            raise ValueError("a fleet needs a worker, a merger and attempts of some length")
        self.f, self.c = fleet, costs
        self.clock = _Clock()
        shared = fleet.shared_cores is not None
        pool = _SharedCores(self.clock, fleet.shared_cores) if shared else None  # type: ignore[arg-type]
        own = _OwnCores(self.clock)
        self.worker_cpu: _Cpu = pool or own
        self.api = _Station(pool or own)
        self.driver = _Station(pool or own)
        self.merger_cpu: _Cpu = pool or own
        self.merge_queue: deque[tuple[_Result, Callback]] = deque()
        self.merging = False
        self.shards = fleet.workers * fleet.shards_per_worker
        self.epoch = 0
        self.queue: deque[tuple[int, int]] = deque()  # (shard, try) of the open epoch
        self.left = 0  # shards of the open epoch not merged yet
        self.idle: list[int] = []
        self.last: dict[int, _Result] = {}
        self.tries: dict[int, int] = {}
        self.merged = self.preempted = 0
        self.train_merged = 0.0
        self.overhead = 0.0
        self.last_merge = 0.0
        self.worker_demand = costs.worker_cpu_s + costs.worker_cpu_s_per_gb * fleet.model_gb

    # -- the epoch and its shards -------------------------------------------------

    def open_epoch(self) -> None:
        self.queue = deque((s, 0) for s in range(self.shards))
        self.left = self.shards
        idle, self.idle = self.idle, []
        for slot in idle:
            self.take(slot)

    def take(self, slot: int) -> None:
        if not self.queue:
            self.idle.append(slot)
            return
        shard, tries = self.queue.popleft()
        self.attempt(slot, shard, tries, self.clock.now)

    def draws(self, shard: int, tries: int) -> tuple[float, float, float, float]:
        """This attempt's training seconds, time to its slot's preemption, and its
        worker's CPU seconds before and after training."""
        f, c = self.f, self.c
        rng = np.random.default_rng((f.seed, self.epoch, shard, tries))
        half = self.worker_demand / 2
        before = after = half
        if c.worker_cv > 0 and half > 0:
            shape = 1 / c.worker_cv**2
            before, after = (float(x) for x in rng.gamma(shape, half / shape, 2))
        train = f.attempt_s
        if f.attempt_cv > 0:
            sigma = math.sqrt(math.log1p(f.attempt_cv**2))
            train = f.attempt_s * float(rng.lognormal(-sigma * sigma / 2, sigma))
        rate = f.preempt_per_hour / 3600.0
        kill = float(rng.exponential(1.0 / rate)) if rate > 0 else math.inf
        return train, kill, before, after

    # -- one attempt ----------------------------------------------------------------

    def attempt(self, slot: int, shard: int, tries: int, started: float) -> None:
        train, kill, before, after = self.draws(shard, tries)

        def post() -> None:
            result = _Result(train)
            self.last[slot] = result
            self.overhead += self.clock.now - started - train
            self.driver.submit(self.c.driver_s, lambda: self.enqueue_merge(result))
            self.take(slot)

        def training() -> None:
            if kill < train:
                self.clock.at(self.clock.now + kill, lost)
            else:
                self.clock.at(self.clock.now + train, lambda: self.worker_cpu.run(after, post))

        def lost() -> None:
            self.preempted += 1
            self.queue.appendleft((shard, tries + 1))
            self.last.pop(slot, None)  # a fresh machine has no result to wait for
            self.clock.at(self.clock.now + self.f.replace_s, lambda: self.take(slot))

        def claimed() -> None:
            self.await_own(slot, lambda: self.worker_cpu.run(before + self.c.ledger_s, training))

        self.api.submit(self.c.api_s, claimed)

    def await_own(self, slot: int, then: Callback) -> None:
        """Go on once this slot's previous result is merged, or after the wait's cap."""
        prev = self.last.pop(slot, None)
        if prev is None or prev.merged:
            then()
            return
        gone = [False]

        def once() -> None:
            if not gone[0]:
                gone[0] = True
                then()

        prev.waiters = [*(prev.waiters or []), once]
        self.clock.at(self.clock.now + self.c.own_merge_wait_s, once)

    # -- the merges -----------------------------------------------------------------

    def enqueue_merge(self, result: _Result) -> None:
        self.merge_queue.append((result, lambda: self.merged_one(result)))
        self.next_merge()

    def next_merge(self) -> None:
        if self.merging or not self.merge_queue:
            return
        self.merging = True
        _, done = self.merge_queue.popleft()
        k = self.f.mergers
        ranges = [k]

        def range_done() -> None:
            ranges[0] -= 1
            if ranges[0] == 0:
                publish = self.c.publish_s if k > 1 else 0.0
                self.clock.at(self.clock.now + publish, finished)

        def finished() -> None:
            self.merging = False
            done()
            self.next_merge()

        for _ in range(k):
            self.merger_cpu.run(self.c.merge_s / k, range_done)

    def merged_one(self, result: _Result) -> None:
        result.merged = True
        for w in result.waiters or []:
            w()
        self.merged += 1
        self.train_merged += result.train_s
        self.last_merge = self.clock.now
        self.left -= 1
        if self.left == 0 and self.epoch + 1 < self.f.epochs:
            self.epoch += 1
            self.clock.at(self.clock.now + self.c.barrier_s, self.open_epoch)


def simulate(fleet: Fleet, costs: Costs) -> Outcome:
    """Run ``fleet`` with ``costs`` to its last merge; the same inputs give the same outcome."""
    run = _Run(fleet, costs)
    run.idle = list(range(fleet.workers))
    run.open_epoch()
    run.clock.run()
    wall = run.last_merge
    n = fleet.workers
    return Outcome(
        utilization=run.train_merged / (n * wall) if wall > 0 else 1.0,
        wall_s=wall,
        merged=run.merged,
        preempted=run.preempted,
        merges_per_s=run.merged / wall if wall > 0 else math.inf,
        mean_overhead_s=run.overhead / run.merged if run.merged else 0.0,
    )

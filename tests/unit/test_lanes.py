"""The lanes' lock (tests/lanes.py): an ``alone`` test never overlaps another, and gets in."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from pathlib import Path

from tests.lanes import held


def _ordinary(lock_dir: str, until: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """A worker running ordinary tests: one short shared hold after another, no gap."""
    while time.monotonic() < until:
        with held(Path(lock_dir), alone=False):
            start = time.monotonic()
            time.sleep(0.05)
            out.put(("ordinary", start, time.monotonic()))


def _alone(lock_dir: str, after: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    time.sleep(max(0.0, after - time.monotonic()))
    with held(Path(lock_dir), alone=True):
        start = time.monotonic()
        time.sleep(0.3)
        out.put(("alone", start, time.monotonic()))


def test_an_alone_test_runs_between_ordinary_ones_and_is_not_starved(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    t0 = time.monotonic() + 2.0  # both processes have started by then (spawn imports)
    procs = [
        ctx.Process(target=_ordinary, args=(str(tmp_path), t0 + 3.0, out)),
        ctx.Process(target=_ordinary, args=(str(tmp_path), t0 + 3.0, out)),
        ctx.Process(target=_alone, args=(str(tmp_path), t0 + 0.5, out)),
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    spans = []
    while True:
        try:
            spans.append(out.get(timeout=2))
        except queue.Empty:
            break
    [alone] = [s for s in spans if s[0] == "alone"]
    ordinary = [s for s in spans if s[0] == "ordinary"]
    # the two ordinary streams overlap each other: shared holders share
    assert any(a[1] < b[2] and b[1] < a[2] for a in ordinary for b in ordinary if a is not b)
    # nothing overlaps the alone test
    assert not [s for s in ordinary if s[1] < alone[2] and alone[1] < s[2]], (alone, ordinary)
    # it got in while the stream of ordinary tests was still going (no starvation)
    assert alone[2] < t0 + 3.0, (alone, t0)
    assert any(s[1] >= alone[2] for s in ordinary)

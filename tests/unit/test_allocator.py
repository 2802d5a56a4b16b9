"""vcdl.worker.allocator: glibc thresholds that keep tensor allocations off the mmap path.

Each case runs in a fresh interpreter started with Dask's worker environment
(``MALLOC_TRIM_THRESHOLD_=65536``) and counts minor page faults while it
allocates, touches and frees a 1 MiB buffer again and again: on the mmap
path every cycle faults in all 256 pages; from the heap, none. (Not 4 MiB:
numpy asks for transparent huge pages from 4 MiB up, and where the kernel
has one free a whole cycle takes 2 faults on the mmap path too — a CI run
saw 3.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vcdl.worker.allocator import tune_allocator

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only"
)

PROBE = r"""
import json, resource, sys
import numpy as np
from vcdl.worker.allocator import tune_allocator

def faults_per_cycle(cycles=40):
    for _ in range(3):
        np.ones(1 << 18, dtype=np.float32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(cycles):
        a = np.ones(1 << 18, dtype=np.float32)  # 1 MiB, every page written
        del a
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / cycles

untuned = faults_per_cycle()
applied = tune_allocator()
print(json.dumps({"untuned": untuned, "applied": applied, "tuned": faults_per_cycle()}))
"""


def _probe(**env: str) -> dict[str, float]:
    full = {k: v for k, v in os.environ.items() if k != "VCDL_MALLOC_TUNING"}
    full.update(MALLOC_TRIM_THRESHOLD_="65536", **env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tuning_takes_allocations_off_the_mmap_path() -> None:
    r = _probe()
    # Dask's environment: a 1 MiB buffer is a fresh mmap each time (256 pages).
    assert r["untuned"] > 200, r
    assert r["applied"] is True
    assert r["tuned"] < 20, r


def test_switch_off_leaves_the_allocator_alone() -> None:
    r = _probe(VCDL_MALLOC_TUNING="0")
    assert r["applied"] is False
    assert r["tuned"] > 200, r


def test_idempotent_in_this_process() -> None:
    assert tune_allocator() is True
    assert tune_allocator() is True

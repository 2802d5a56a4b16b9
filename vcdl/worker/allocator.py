"""The C allocator settings a training process runs with (glibc's malloc on Linux).

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``) so that freed memory goes back to
the OS. Setting any glibc threshold also switches off glibc's dynamic mmap
threshold, so every allocation above 128 KiB is a fresh ``mmap`` whose pages
are faulted in and zeroed again, and freed with ``munmap``. A PyTorch
training step allocates and frees its activations and gradients (MiBs) at
every step: in a Dask worker, MNIST-1D ``cnn1d`` width 256 trained at about
2 100 samples/s against 3 400-3 900 in a plain process on the same machine
(``benchmarks/allocator.py`` measures it).

:func:`tune_allocator` sets both thresholds explicitly: blocks up to 32 MiB
(glibc's own upper bound for the dynamic threshold on 64-bit) come from the
heap and are reused, and the heap gives memory back once more than 128 MiB
at its top is free. A worker still returns memory after a large model is
gone, without paying page faults on every step. It is applied in every
worker's warm-up (flows/workarounds/warmup.py), also on an external fleet whatever the
environment its workers were started with, and can be switched off with
``VCDL_MALLOC_TUNING=0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

# glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20
"""Allocations above this are mmap'd (glibc's maximum dynamic value on 64-bit)."""
TRIM_THRESHOLD = 128 << 20
"""Free memory at the top of the heap above this is returned to the OS."""

ENV_SWITCH = "VCDL_MALLOC_TUNING"

TUNED_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
}
"""The same thresholds as the environment variables glibc reads at start-up:
a process started with them allocates as a tuned worker does, unchanged."""


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    # musl (Alpine) has no mallopt thresholds to set; glibc has gnu_get_libc_version.
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return None
    return libc


def tune_allocator(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> bool:
    """Set glibc's mmap and trim thresholds for this process; True if they were set.

    A no-op (False) off glibc, or when ``VCDL_MALLOC_TUNING=0``. Idempotent
    and cheap: call it in every process that trains.
    """
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
    )
    if not ok:  # glibc refuses values out of its range: keep what the process has
        log.warning("mallopt refused mmap/trim thresholds %s/%s", mmap_threshold, trim_threshold)
    return ok

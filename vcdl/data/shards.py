"""Shard plans: which training rows each subtask of an epoch trains on. Pure.

A plan is a function of (n, shards, seed, epoch), so any worker can recompute
its shard's rows from the subtask's coordinates without the plan travelling
anywhere.
"""

from __future__ import annotations

import operator

import numpy as np

from vcdl.errors import DataError


def shard_plan(n: int, shards: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Split a fresh seeded permutation of ``range(n)`` into ``shards`` parts.

    Pure and deterministic in (n, shards, seed, epoch); a different epoch
    gives a different permutation. Every index appears exactly once; part
    sizes differ by at most 1 (the first ``n % shards`` parts are larger).
    """
    n, shards, seed, epoch = (operator.index(v) for v in (n, shards, seed, epoch))
    if shards < 1 or shards > n:
        raise DataError(f"shards must be between 1 and n={n}, got {shards}")
    if seed < 0 or epoch < 0:
        raise DataError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    # (seed, epoch) as SeedSequence entropy: independent streams per epoch.
    perm = np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)
    return list(np.array_split(perm, shards))


def shard_indices(n: int, shards: int, seed: int, epoch: int, shard: int) -> np.ndarray:
    """The rows of one shard: ``shard_plan(n, shards, seed, epoch)[shard]``."""
    shard = operator.index(shard)
    plan = shard_plan(n, shards, seed, epoch)
    if not 0 <= shard < len(plan):
        raise DataError(f"shard must be in [0, {len(plan)}), got {shard}")
    return plan[shard]

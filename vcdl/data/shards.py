"""Shard plans: which training rows each subtask of an epoch trains on. Pure.

A plan is a function of (n, shards, seed, epoch) and, for the chunk-aligned
plan, the split's rows per chunk, so any worker can recompute its shard's
rows from the subtask's coordinates without the plan travelling anywhere.

Two plans (``data.plan``):

- ``rows``: a fresh permutation of all rows, cut into ``shards`` parts. A
  shard's rows then lie in every chunk of the stored split, so an attempt
  that reads from the store decodes the whole split.
- ``blocks`` (the default): the split's chunks (blocks of ``block`` rows) in
  a fresh order, the rows of each block in a fresh order, all concatenated
  and cut into ``shards`` parts. A shard spans about ``n / shards``
  consecutive rows of that sequence, so it touches at most
  ``ceil(rows / block) + 2`` chunks (its two ends, and the split's short
  last chunk), and an epoch touches each chunk once plus at most one per
  boundary between shards: it reads the split about once whatever the
  number of shards.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Literal

import numpy as np

from vcdl.errors import DataError

Plan = Literal["rows", "blocks"]


def _check(n: int, shards: int, seed: int, epoch: int) -> tuple[int, int, int, int]:
    n, shards, seed, epoch = (operator.index(v) for v in (n, shards, seed, epoch))
    if shards < 1 or shards > n:
        raise DataError(f"shards must be between 1 and n={n}, got {shards}")
    if seed < 0 or epoch < 0:
        raise DataError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return n, shards, seed, epoch


def block_order(n: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """All of ``range(n)``: blocks of ``block`` rows in a random order, rows shuffled within."""
    blocks = -(-n // block)
    rank = np.empty(blocks, dtype=np.int64)
    rank[rng.permutation(blocks)] = np.arange(blocks)
    # Sorting by (block's rank, random key) shuffles rows within each block.
    keys = rng.random(n)
    return np.lexsort((keys, rank[np.arange(n) // block])).astype(np.int64)


def shard_plan(
    n: int,
    shards: int,
    seed: int,
    epoch: int,
    *,
    block: int | None = None,
    sizes: Sequence[int] | None = None,
) -> list[np.ndarray]:
    """Split a fresh seeded order of ``range(n)`` into ``shards`` parts.

    ``block`` None: the ``rows`` plan, a permutation of all rows. ``block``
    = the split's rows per chunk: the ``blocks`` plan (module docstring).
    Pure and deterministic in its arguments; a different epoch gives a
    different order. Every index appears exactly once; part sizes differ by
    at most 1 (the first ``n % shards`` parts are larger), unless ``sizes``
    (one per shard, each >= 1, summing to ``n``: :mod:`vcdl.data.sizing`)
    gives them: the same order, cut into parts of those sizes.
    """
    n, shards, seed, epoch = _check(n, shards, seed, epoch)
    # (seed, epoch) as SeedSequence entropy: independent streams per epoch.
    rng = np.random.default_rng([seed, epoch])
    if block is None:
        order = rng.permutation(n).astype(np.int64)
    else:
        block = operator.index(block)
        if block < 1:
            raise DataError(f"block must be >= 1 row, got {block}")
        order = block_order(n, block, rng)
    if sizes is None:
        return list(np.array_split(order, shards))
    cuts = _check_sizes(n, shards, sizes)
    return list(np.split(order, cuts))


def _check_sizes(n: int, shards: int, sizes: Sequence[int]) -> list[int]:
    """Where the parts of ``sizes`` start (all but the first), once they are checked."""
    sizes = [operator.index(s) for s in sizes]
    if len(sizes) != shards or sum(sizes) != n or min(sizes) < 1:
        raise DataError(
            f"shard sizes must be {shards} counts >= 1 summing to n={n}, got {sizes[:8]}"
            f"{'...' if len(sizes) > 8 else ''} (sum {sum(sizes)})"
        )
    return np.cumsum(sizes)[:-1].tolist()


def shard_indices(
    n: int,
    shards: int,
    seed: int,
    epoch: int,
    shard: int,
    *,
    block: int | None = None,
    sizes: Sequence[int] | None = None,
) -> np.ndarray:
    """The rows of one shard: ``shard_plan(n, shards, seed, epoch, ...)[shard]``, the same
    ``block`` and ``sizes``."""
    shard = operator.index(shard)
    plan = shard_plan(n, shards, seed, epoch, block=block, sizes=sizes)
    if not 0 <= shard < len(plan):
        raise DataError(f"shard must be in [0, {len(plan)}), got {shard}")
    return plan[shard]


def chunks_touched(rows: np.ndarray, block: int) -> int:
    """How many chunks of ``block`` rows the given rows lie in."""
    return int(np.unique(np.asarray(rows) // block).size)

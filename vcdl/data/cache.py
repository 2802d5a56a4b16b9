"""Each worker process's cache of decoded training splits (``data.cache_mb``).

Reading a shard from the store decodes every chunk its rows lie in: about
its share of the split under the chunk-aligned plan, every chunk under the
row plan (MNIST-1D's 5 MB whole: ~10 ms of CPU on an idle core, ~40 ms of
wall on two loaded cores). A split that fits the budget is decoded once per
process and indexed in memory; a larger one is streamed
(:mod:`vcdl.data.stream`). Keyed by the store location, split, the data set's fingerprint
and the fields read, so a data set imported again under the same name is
read afresh.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping

import numpy as np
import zarr

Arrays = dict[str, np.ndarray]


def nbytes(arrays: Mapping[str, zarr.Array | np.ndarray]) -> int:
    """Decoded size of a split's arrays, from their shapes (nothing read)."""
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays.values())


class SplitCache:
    """Decoded splits kept in memory, least recently used first out, within a byte budget.

    Thread-safe: a worker's spare Dask thread reads ahead while another
    trains. The budget is the largest any caller asked for; a split larger
    than the caller's budget is never kept.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, Arrays] = OrderedDict()
        self.budget = 0

    def arrays(self, key: Hashable, stored: Mapping[str, zarr.Array], budget: int) -> Arrays | None:
        """The split's decoded arrays (read on the first call), or None if over ``budget``."""
        if nbytes(stored) > budget:
            return None
        # Under the lock: two threads asking at once decode the split once.
        with self._lock:
            self.budget = max(self.budget, budget)
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
            decoded = {f: np.asarray(a[...]) for f, a in stored.items()}
            for a in decoded.values():
                a.setflags(write=False)  # shared by every later shard: never written
            self._items[key] = decoded
            while sum(nbytes(v) for v in self._items.values()) > self.budget:
                self._items.popitem(last=False)
            return decoded


split_cache = SplitCache()
"""This process's cache of decoded splits (:func:`vcdl.data.datasets.read_arrays`)."""

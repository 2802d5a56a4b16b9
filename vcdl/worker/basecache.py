"""An attempt's base weights, read off its critical path: :class:`BaseReads`.

Why: on a slow link the read of an attempt's base (its version's weights,
from the store) idles the worker for as long as the transfer takes, and
under the averaging rule every shard of an epoch reads the *same* pinned
version, so a worker that trains several shards of an epoch fetched one
version several times. This module owns where an attempt's base comes from:

* a read runs in a background thread (:meth:`BaseReads.start`), so that the
  attempt builds its model and reads its rows meanwhile, and waits only
  for what is left of it (:meth:`BaseRead.wait`: the network wait the
  attempt records);
* a *pinned* base (the task names its version: ``pins_base`` rules) is kept,
  one version per worker process: the next shard of the epoch finds it
  read, and the read-ahead stage (:mod:`vcdl.worker.readahead`) starts it
  before the attempt's training slot is free. A head read at claim time
  (VC-ASGD) is never kept: the next claim's head is a newer version.

Bounds and honesty: one kept version per process (a new one replaces it;
an attempt still training holds its own reference, so at most two are in
memory while an epoch turns over). A read whose key was replaced meanwhile
runs to its end and is dropped: a Zarr read cannot be cut short. A failed
read is not kept: the attempt that waits for it gets the error and records
it, like its own read's. Versions never change once written and each read
checks the ledger's checksum, which is part of the key, so a kept base is
the bytes the attempt would have read itself; states are shared read-only
(``model.load_state_dict`` copies, encoders only read). Nothing here
writes: a worker killed mid-read leaves nothing behind.
``VCDL_NETWORK_OVERLAP=0`` turns every overlap off (each attempt reads its
base itself, on its critical path, as before), for comparisons.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from vcdl.types import StateDict

#: ``0`` turns the worker's network overlaps off: base reads in the background,
#: kept pinned bases, and the result's write after the training slot is handed on.
OVERLAP_ENV = "VCDL_NETWORK_OVERLAP"

BaseKey = tuple[str, int, str, str]
"""(run, version, group uri, the ledger's checksum) of a base."""


def overlap_enabled() -> bool:
    """Whether the worker overlaps its network waits (``VCDL_NETWORK_OVERLAP``, default on)."""
    return os.environ.get(OVERLAP_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class BaseRead:
    """One base being read (or read): its state once there, and how long its read took."""

    key: BaseKey
    owner: tuple[str, int, int] | None = None
    """(run, epoch, shard) of the attempt it was started for (its read-ahead), if any."""
    future: Future[StateDict] = field(default_factory=Future)
    read_seconds: float = 0.0
    """The store read's own seconds, wherever it ran (set when it ends)."""

    def wait(self) -> tuple[StateDict, float]:
        """The state, and the seconds this call waited for it; the read's error if it failed."""
        t = time.perf_counter()
        state = self.future.result()
        return state, time.perf_counter() - t


def keep_decision(kept: BaseKey | None, wanted: BaseKey, pinned: bool) -> str:
    """What to do for ``wanted`` given the kept key: ``use`` it, ``replace`` it, or ``once``.

    Pure. ``once``: a head read at claim time, read for this attempt alone and
    not kept (the next claim's head is a newer version).
    """
    if not pinned:
        return "once"
    return "use" if kept == wanted else "replace"


class BaseReads:
    """A worker process's base reads: started in the background, a pinned one kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: BaseRead | None = None

    def start(
        self,
        key: BaseKey,
        read: Callable[[], StateDict],
        pinned: bool,
        owner: tuple[str, int, int] | None = None,
    ) -> tuple[BaseRead, bool]:
        """The read of ``key``: the kept one, or a new one started in a daemon thread for
        ``owner``; and whether it was started by this call.

        ``read`` reads and verifies the base (it runs in the thread). A failed
        kept read is dropped, so the next call starts another.
        """
        with self._lock:
            kept = self._kept
            if kept is not None and kept.future.done() and kept.future.exception() is not None:
                self._kept = kept = None
            decision = keep_decision(kept.key if kept is not None else None, key, pinned)
            if decision == "use":
                assert kept is not None
                return kept, False
            entry = BaseRead(key, owner)
            if decision == "replace":
                self._kept = entry  # the previous kept base goes once no attempt holds it
        threading.Thread(
            target=self._run, args=(entry, read), name=f"vcdl-base-{key[1]}", daemon=True
        ).start()
        return entry, True

    def _run(self, entry: BaseRead, read: Callable[[], StateDict]) -> None:
        t = time.perf_counter()
        try:
            state = read()
        except BaseException as exc:  # handed to whoever waits: they record it
            entry.read_seconds = time.perf_counter() - t
            entry.future.set_exception(exc)
            return
        entry.read_seconds = time.perf_counter() - t
        entry.future.set_result(state)

    def kept(self) -> BaseKey | None:
        """The key of the kept base, if any."""
        with self._lock:
            return self._kept.key if self._kept is not None else None

    def clear(self) -> None:
        """Forget the kept base (a read in flight ends and is dropped)."""
        with self._lock:
            self._kept = None

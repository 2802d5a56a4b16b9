"""An attempt's base weights: read in the background and kept, or read here and now.

:func:`start_base_read` is where an attempt asks for its base version: it
reads the version's row from the ledger and hands the store read, checked
against the ledger's checksum, to the worker process's
:class:`~vcdl.worker.basecache.BaseReads` (in the background; kept when the
task pins its base), or, with the network overlap off
(``VCDL_NETWORK_OVERLAP=0``), reads it at once as attempts always did.
:data:`NET_WAIT_KEY` names the seconds an attempt waited on the store while
holding its training slot.
"""

from __future__ import annotations

import time

from vcdl.runtime import RunRef
from vcdl.types import StateDict
from vcdl.worker.basecache import BaseRead
from vcdl.worker.runtime import WorkerRuntime

NET_WAIT_KEY = "net_wait"
"""The key of an attempt's ``timings`` for the seconds it waited on the store, holding its
training slot, for its base and its result: part of ``read`` and ``write``, not a phase
beside them (a result written after the slot was handed on is no wait of the worker's)."""


def start_base_read(
    ref: RunRef,
    runtime: WorkerRuntime,
    version: int,
    pinned: bool,
    overlap: bool,
    owner: tuple[str, int, int] | None = None,
) -> tuple[BaseRead, bool]:
    """The read of ``ref``'s version ``version`` as the base of attempt ``owner`` (run,
    epoch, shard), checked against the ledger's checksum: in the background (kept when
    ``pinned``), or, without ``overlap``, done here and now as it always was; and whether
    this call started it (not kept)."""
    row = ref.ledger(fenced=False).get_version(ref.run, version)
    store = ref.store()

    def read() -> StateDict:
        # Against the ledger's checksum, not only the group's own.
        return store.read_state(row.uri, expect=row.checksum)

    key = (ref.run, version, row.uri, row.checksum)
    if overlap:
        return runtime.bases.start(key, read, pinned, owner)
    done = BaseRead(key, owner)
    t = time.perf_counter()
    try:
        done.future.set_result(read())
    finally:
        done.read_seconds = time.perf_counter() - t
    return done, True

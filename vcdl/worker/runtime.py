"""A worker process's state, in one object: :class:`WorkerRuntime`.

What one attempt leaves for the next in the same process lives here, and
nowhere else: the optimizer state and the own result it carries per run, the
result whose merge the next attempt awaits, the memory gates, the training
slots, the preemption notice, the model's bytes as last read, and the base
weights read in the background or kept (:mod:`vcdl.worker.basecache`).

* :class:`VcdlWorkerPlugin` — a Dask worker plugin: its ``setup`` creates the
  worker's runtime and installs its SIGTERM handler, its ``teardown`` closes
  it. Registered on every worker, also those that join later
  (``flows/cluster.py``).
* :func:`runtime_of` / :func:`current_runtime` — the runtime of a Dask
  worker, or of the one this thread runs on. Code outside any worker (the
  driver's own evaluation, a test calling an attempt in-process) makes its own
  :class:`WorkerRuntime` and hands it down; nothing is kept between callers
  that do not share one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from distributed.diagnostics.plugin import WorkerPlugin

from vcdl.types import StateDict
from vcdl.worker.admission import MemoryGate, MemoryGates, process_rss
from vcdl.worker.basecache import BaseReads
from vcdl.worker.cloud_notice import Cloud, CloudPoller, MetadataWatcher
from vcdl.worker.preemption import Notice
from vcdl.worker.slots import TrainingSlots

#: The name the plugin is registered under on every worker.
PLUGIN_NAME = "vcdl-runtime"
CARRIED_FROM = "vcdl_attempt"
"""The key of a kept optimizer state that names the attempt it ended (vcdl.replay)."""


@dataclass(eq=False)
class WorkerRuntime:
    """One worker process's state, handed to each attempt it runs.

    In memory only: a restarted worker starts with a fresh one.
    """

    worker: Any | None = None
    """The Dask worker this runtime belongs to; None outside one."""
    notice: Notice = field(default_factory=Notice)
    """The process's preemption notice (SIGTERM)."""
    optimizer: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Run -> the optimizer state this worker's last attempt of the run ended with
    (``train.optimizer_state = "worker"``); its :data:`CARRIED_FROM` key names that
    attempt (what a replay re-trains first)."""
    own_result: dict[str, tuple[str, StateDict]] = field(default_factory=dict)
    """Run -> this worker's last result of the run and the attempt that trained it,
    for merge rules that keep a variable per worker (EASGD)."""
    unmerged: dict[str, str] = field(default_factory=dict)
    """Run -> this process's last recorded attempt the driver may not have merged yet."""
    model_bytes: dict[str, int] = field(default_factory=dict)
    """Run -> the model's bytes as this process last read them (admission's estimates)."""
    gates: MemoryGates = field(default_factory=MemoryGates)
    slots: TrainingSlots = field(default_factory=TrainingSlots)
    bases: BaseReads = field(default_factory=BaseReads)
    """Base reads in the background, and the pinned base kept for the epoch's next shard."""
    watcher: MetadataWatcher | None = None
    """The poller of the cloud's preemption notices (``fault.cloud_notices``), if any."""
    closed: bool = False

    @classmethod
    def for_worker(cls, worker: Any) -> WorkerRuntime:
        """A fresh runtime for Dask ``worker``: its notice takes the worker out of the pool."""
        return cls(worker=worker, notice=Notice(worker))

    def notice_received(self) -> bool:
        """True once this process got a preemption notice."""
        return self.notice.received()

    def gate(self, fraction: float) -> MemoryGate | None:
        """This worker's memory gate for admission ``fraction``; None without a worker, a
        memory limit or admission (``fraction`` 0)."""
        return self.gates.of_worker(self.worker, fraction)

    def gate_for(
        self, limit: int, fraction: float, rss: Callable[[], int] = process_rss
    ) -> MemoryGate:
        """The gate for a memory ``limit`` and admission ``fraction`` (one per pair)."""
        return self.gates.gate_for(limit, fraction, rss)

    def watch_cloud(self, cloud: str, interval: float) -> None:
        """Poll ``cloud``'s metadata service for preemption notices ("off": none).

        A notice does what SIGTERM does (:meth:`Notice.set`). Started by the
        first attempt of a run that asks for it, it goes on between attempts
        (an idle worker under notice leaves the pool too) until the runtime
        closes or a run asks for another cloud.
        """
        current = self.watcher
        if current is not None and current.alive() and current.cloud == cloud:
            return
        if current is not None:
            current.stop()
            self.watcher = None
        if cloud == "off" or self.closed:
            return
        poller = CloudPoller(cast(Cloud, cloud))  # it refuses another name
        self.watcher = MetadataWatcher(poller, interval, lambda _: self.notice.set()).start()

    def close(self) -> None:
        """Forget what attempts left here and put back the SIGTERM handler replaced."""
        self.closed = True
        if self.watcher is not None:
            self.watcher.stop()
        self.notice.uninstall()
        self.optimizer.clear()
        self.own_result.clear()
        self.unmerged.clear()
        self.model_bytes.clear()
        self.bases.clear()


class VcdlWorkerPlugin(WorkerPlugin):
    """Creates a worker's :class:`WorkerRuntime` at its start, closes it at its end.

    Registered on every worker (also on workers that join later), once per
    cluster (``idempotent``): a second run on the same fleet keeps the runtime.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.runtime: WorkerRuntime | None = None

    def setup(self, worker: Any) -> None:
        runtime = WorkerRuntime.for_worker(worker)
        self.runtime = runtime
        # setup runs on the worker's event loop; with a nanny that loop is the
        # worker process's main thread, where signal handlers may be set.
        if not runtime.notice.install():
            worker.loop.add_callback(runtime.notice.install)

    def teardown(self, worker: Any) -> None:
        if self.runtime is not None:
            self.runtime.close()


def runtime_of(worker: Any) -> WorkerRuntime:
    """The runtime of Dask ``worker``, created by :class:`VcdlWorkerPlugin`."""
    plugin = getattr(worker, "plugins", {}).get(PLUGIN_NAME)
    runtime = getattr(plugin, "runtime", None)
    if runtime is None:
        raise LookupError(
            f"Dask worker {getattr(worker, 'address', worker)} has no vcdl runtime: "
            f"the {PLUGIN_NAME!r} worker plugin is not registered "
            "(flows.cluster.register_worker_plugins)"
        )
    assert isinstance(runtime, WorkerRuntime)
    return runtime


def current_runtime() -> WorkerRuntime | None:
    """The runtime of the Dask worker this thread runs on; None outside a worker."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except ValueError:  # not in a Dask worker (the driver, a test, a thread pool)
        return None
    return runtime_of(worker)

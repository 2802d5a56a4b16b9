"""A worker process's state lives in one runtime (vcdl.worker.runtime), not in module globals."""

from __future__ import annotations

import ast
import os
import signal
import types
from pathlib import Path
from typing import Any

import pytest

from vcdl.worker.preemption import leave_pool
from vcdl.worker.runtime import (
    PLUGIN_NAME,
    VcdlWorkerPlugin,
    WorkerRuntime,
    current_runtime,
    runtime_of,
)

REPO = Path(__file__).resolve().parents[2]

#: Calls whose result is mutable state: containers and synchronization objects.
MUTABLE_CALLS = {
    "dict",
    "list",
    "set",
    "bytearray",
    "deque",
    "defaultdict",
    "OrderedDict",
    "Counter",
    "ChainMap",
    "WeakValueDictionary",
    "WeakKeyDictionary",
    "WeakSet",
    "Event",
    "Lock",
    "RLock",
    "Semaphore",
    "BoundedSemaphore",
    "Condition",
    "Barrier",
    "local",
    "Queue",
    "SimpleQueue",
}
MUTABLE_LITERALS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
CACHE_DECORATORS = {"lru_cache", "cache", "cached_property"}
#: Constants written as containers, read and never written: no process state.
#: TUNED_ENV is glibc's thresholds as environment variables; the benchmarks
#: take it as a ``dict[str, str]``.
CONSTANTS = {("vcdl/worker/allocator.py", "TUNED_ENV")}


def _name(node: ast.expr) -> str:
    """The last name of ``f``, ``a.b.f`` or ``f(...)``."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def module_state(source: str) -> list[str]:
    """Module-level mutable caches in ``source``: 'line: what' for each."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names == ["__all__"] or value is None:
                continue
            if isinstance(value, MUTABLE_LITERALS) or (
                isinstance(value, ast.Call) and _name(value) in MUTABLE_CALLS
            ):
                found.append(f"{node.lineno}: {', '.join(names) or '?'}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            cached = [d for d in node.decorator_list if _name(d) in CACHE_DECORATORS]
            if cached:
                found.append(f"{node.lineno}: {node.name} (cached)")
    return found


def worker_modules() -> list[Path]:
    return [*sorted((REPO / "vcdl" / "worker").glob("*.py")), REPO / "flows" / "tasks.py"]


def test_no_module_level_mutable_cache_in_the_worker() -> None:
    found = {}
    for p in worker_modules():
        path = str(p.relative_to(REPO))
        state = [
            s for s in module_state(p.read_text()) if (path, s.split(": ")[1]) not in CONSTANTS
        ]
        if state:
            found[path] = state
    assert found == {}, f"worker state belongs in WorkerRuntime (vcdl/worker/runtime.py): {found}"


def test_the_check_finds_what_the_worker_held_before() -> None:
    before = """
import functools, threading
from collections import deque
_OPTIMIZER: dict[str, dict] = {}
_NOTICE = threading.Event()
_NOTICE_AT: list[float] = []
_GATES_LOCK = threading.Lock()
_QUEUE = deque()
ok = (1, 2)
LIMIT = 4
__all__ = ["x"]

@functools.lru_cache(maxsize=8)
def rows(n): return n

@functools.cache
def more(n): return n
"""
    assert [f.split(": ")[1] for f in module_state(before)] == [
        "_OPTIMIZER",
        "_NOTICE",
        "_NOTICE_AT",
        "_GATES_LOCK",
        "_QUEUE",
        "rows (cached)",
        "more (cached)",
    ]


class FakeWorker:
    def __init__(self) -> None:
        self.address = "tcp://fake:1"
        self.plugins: dict[str, Any] = {}
        self.callbacks: list[tuple[Any, ...]] = []
        self.loop = types.SimpleNamespace(add_callback=lambda *a: self.callbacks.append(a))
        self.memory_manager = types.SimpleNamespace(memory_limit=None)


def test_the_plugin_creates_the_runtime_and_closes_it() -> None:
    worker = FakeWorker()
    with pytest.raises(LookupError, match=PLUGIN_NAME):
        runtime_of(worker)
    previous = signal.getsignal(signal.SIGTERM)
    plugin = VcdlWorkerPlugin()
    try:
        plugin.setup(worker)  # this test runs in the main thread, as a nanny's worker
        worker.plugins[PLUGIN_NAME] = plugin
        runtime = runtime_of(worker)
        assert runtime.worker is worker and not runtime.notice_received()
        runtime.optimizer["r"] = {"state": {}}
        os.kill(os.getpid(), signal.SIGTERM)
        assert runtime.notice_received() and runtime.notice.at is not None
        # The notice takes the worker out of the pool, on the worker's own loop.
        assert worker.callbacks == [(leave_pool, worker)]
        plugin.teardown(worker)
        assert runtime.closed and runtime.optimizer == {}
        assert signal.getsignal(signal.SIGTERM) == previous
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_fresh_runtime_shares_nothing() -> None:
    a, b = WorkerRuntime(), WorkerRuntime()
    a.unmerged["r"] = "attempt"
    a.notice.set()
    assert b.unmerged == {} and not b.notice_received()
    assert a.worker is None and a.notice.worker is None
    assert current_runtime() is None  # this thread is no Dask worker's

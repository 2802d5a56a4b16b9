"""Memory admission on a worker (vcdl.worker.admission): the estimate, the rule, the gate."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.driver.dispatch import dispatch_phases
from vcdl.worker.admission import (
    MemoryGate,
    admits,
    admitted,
    attempt_bytes,
    evaluation_bytes,
    optimizer_copies,
)
from vcdl.worker.runtime import WorkerRuntime

MB = 1 << 20


def test_estimate_counts_optimizer_and_result_copies() -> None:
    assert optimizer_copies("sgd") == 0
    assert optimizer_copies("sgd", momentum=0.9) == 1
    assert optimizer_copies("adam") == optimizer_copies("adamw") == 2
    # parameters, gradients, base, snapshot + the result's write buffer
    assert attempt_bytes(100 * MB, "sgd") == 5 * 100 * MB
    # a reduced-precision change: its float32 change, encoding and write buffer
    assert attempt_bytes(100 * MB, "sgd", 0.0, "int8_delta") == 7 * 100 * MB
    assert attempt_bytes(100 * MB, "adam", 0.0, "bf16_delta") == 9 * 100 * MB


@given(
    baseline=st.integers(0, 10**10),
    held=st.integers(0, 10**10),
    need=st.integers(1, 10**10),
    budget=st.integers(0, 10**10),
    in_flight=st.integers(0, 64),
    resident=st.integers(0, 10**10),
)
def test_admits_alone_always_else_within_budget(
    baseline: int, held: int, need: int, budget: int, in_flight: int, resident: int
) -> None:
    ok = admits(baseline, held, need, budget, in_flight, resident)
    if in_flight == 0:
        assert ok
    else:
        assert ok == (baseline + held + need <= budget and resident <= budget)


def test_a_process_grown_past_its_estimates_admits_nothing_more_until_it_shrinks() -> None:
    resident = [100]
    gate = MemoryGate(budget=1000, rss=lambda: resident[0])
    started = threading.Event()

    def second() -> None:
        with gate.hold(100):
            started.set()

    with gate.hold(100):
        resident[0] = 1050  # caches, fragmentation: estimates say 200 of 1000
        t = threading.Thread(target=second)
        t.start()
        assert not started.wait(0.3)
        resident[0] = 500  # it shrank; the next re-check admits
        assert started.wait(5)
    t.join(5)


@settings(max_examples=25, deadline=None)
@given(
    needs=st.lists(st.integers(1, 100), min_size=1, max_size=12),
    budget=st.integers(0, 300),
    baseline=st.integers(0, 100),
)
def test_gate_never_holds_more_than_its_budget_unless_alone(
    needs: list[int], budget: int, baseline: int
) -> None:
    """Threads of random sizes: every one runs, and the sum held never passes the
    budget except by an attempt admitted alone."""
    gate = MemoryGate(budget, rss=lambda: baseline)
    seen: list[tuple[int, int]] = []  # (in_flight, held) while inside
    lock = threading.Lock()
    ran: list[int] = []

    def attempt(need: int) -> None:
        with gate.hold(need):
            with lock:
                seen.append((gate.in_flight, gate.held))
                ran.append(need)
            time.sleep(0.002)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in needs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(ran) == sorted(needs)
    for in_flight, held in seen:
        assert in_flight == 1 or baseline + held <= budget
    assert gate.in_flight == 0 and gate.held == 0


def test_a_waiting_attempt_frees_what_it_read_ahead_and_reports_its_wait() -> None:
    gate = MemoryGate(budget=100, rss=lambda: 10)
    freed: list[str] = []
    waited: list[float] = []
    first_in = threading.Event()
    release_first = threading.Event()

    def first() -> None:
        with gate.hold(60):
            first_in.set()
            release_first.wait(10)

    def second() -> None:
        with gate.hold(60, before_wait=lambda: freed.append("model")) as w:
            waited.append(w)

    t1 = threading.Thread(target=first)
    t1.start()
    assert first_in.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    time.sleep(0.2)
    assert freed == ["model"] and not waited  # 10 + 60 + 60 > 100: it waits
    release_first.set()
    t1.join(10)
    t2.join(10)
    assert waited and waited[0] >= 0.15
    assert gate.waits == 1 and gate.peak_in_flight == 1


def test_an_attempt_that_fits_does_not_call_before_wait() -> None:
    gate = MemoryGate(budget=1000, rss=lambda: 0)
    called: list[int] = []
    with (
        gate.hold(10, before_wait=lambda: called.append(1)) as w1,
        gate.hold(10, before_wait=lambda: called.append(2)) as w2,
    ):
        assert gate.in_flight == 2 and gate.held == 20
    assert not called and w1 < 0.1 and w2 < 0.1


def test_baseline_is_read_again_when_the_last_attempt_ends() -> None:
    rss = iter([100, 250])
    gate = MemoryGate(budget=1000, rss=lambda: next(rss))
    assert gate.baseline == 100
    with gate.hold(10):
        pass
    assert gate.baseline == 250


def test_no_gate_outside_a_worker_or_with_admission_off() -> None:
    runtime = WorkerRuntime()
    assert runtime.gate(0.7) is None  # this runtime is no Dask worker's
    assert runtime.gate(0.0) is None
    with admitted(None, 10**12) as w:
        assert w == 0.0
    g = runtime.gate_for(4 << 30, 0.7, rss=lambda: 0)
    assert runtime.gate_for(4 << 30, 0.7) is g and g.budget == int((4 << 30) * 0.7)
    assert WorkerRuntime().gate_for(4 << 30, 0.7, rss=lambda: 0) is not g  # another runtime's own


def test_a_worker_s_gate_follows_its_memory_limit() -> None:
    import types

    worker = types.SimpleNamespace(memory_manager=types.SimpleNamespace(memory_limit=4 << 30))
    runtime = WorkerRuntime.for_worker(worker)
    gate = runtime.gate(0.5)
    assert gate is not None and gate.budget == 2 << 30
    assert runtime.gate(0.5) is gate
    assert runtime.gate(0.0) is None
    worker.memory_manager.memory_limit = None  # no limit: nothing to admit against
    assert WorkerRuntime.for_worker(worker).gate(0.5) is None


def test_dispatch_phases_report_the_memory_wait() -> None:
    c = {
        "dask_started": 1.0,
        "body_started": 1.0,
        "prefetched": 1.0,
        "slot_acquired": 1.5,
        "admitted": 4.0,
        "body_ended": 9.0,
    }
    p = dispatch_phases(sent=0.0, ready=0.0, received=9.0, clock=c)
    assert p["memory_wait"] == 2.5
    assert p["queued"] == 0.5  # the slot; the memory wait is its own phase
    del c["admitted"]
    assert "memory_wait" not in dispatch_phases(sent=0.0, ready=0.0, received=9.0, clock=c)


def test_a_preemption_notice_ends_the_wait() -> None:
    gate = MemoryGate(budget=100, rss=lambda: 0)
    notice = threading.Event()
    entered = threading.Event()

    def waiting() -> None:
        with gate.hold(80, stop=notice.is_set):
            entered.set()

    with gate.hold(80):
        t = threading.Thread(target=waiting)
        t.start()
        assert not entered.wait(0.3)
        notice.set()  # the worker is going: the task hands back at once
        assert entered.wait(5)
    t.join(5)


def test_an_evaluation_is_gated_by_the_model_an_attempt_read_here() -> None:
    import types
    from typing import cast

    import torch

    from vcdl.config import parse_config
    from vcdl.worker.readahead import attempt_need, evaluation_need
    from vcdl.worker.shard_data import ShardData

    assert evaluation_bytes(100 * MB) == 200 * MB
    run = "eval-need-test"
    # Before any attempt of the run in this process: no estimate, no gating.
    runtime = WorkerRuntime()
    assert evaluation_need(runtime, run) == 0
    model = torch.nn.Linear(1000, 250)  # 250,250 float32 parameters
    data = cast(ShardData, types.SimpleNamespace(model=model))
    attempt_need(runtime, run, data, parse_config({}))
    assert evaluation_need(runtime, run) == evaluation_bytes(250_250 * 4)
    assert evaluation_need(WorkerRuntime(), run) == 0  # another process's

"""flows.workarounds.pipeline: epochs in order, the next one set up in the current one's tail."""

from __future__ import annotations

import contextvars
import signal
import threading
import time
from collections.abc import Callable

import pytest

from vcdl.driver.epoch_loop import EpochGate, RunStopping, current_gate, run_epochs

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="unset")


class FakeEpochs:
    """Epoch bodies that follow the gate protocol, recording what happened when."""

    def __init__(self, body: Callable[[int, EpochGate], None] | None = None) -> None:
        self.log: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.body = body or self.default_body

    def note(self, what: str, epoch: int) -> None:
        with self.lock:
            self.log.append((what, epoch))

    def default_body(self, epoch: int, gate: EpochGate) -> None:
        time.sleep(0.02)  # the first results
        gate.tail()
        time.sleep(0.1)  # the last results: the next epoch sets up meanwhile

    def __call__(self, epoch: int) -> dict[str, int]:
        gate = current_gate()
        assert gate is not None and gate.epoch == epoch
        self.note("started", epoch)
        gate.wait_previous()
        self.note("acts", epoch)
        self.body(epoch, gate)
        self.note("barrier", epoch)
        gate.passed.set()
        time.sleep(0.05)  # Prefect sets the run Completed after the barrier
        return {"epoch": epoch}

    def order(self, what: str) -> list[int]:
        return [e for w, e in self.log if w == what]


def test_epochs_act_in_order_and_each_after_the_previous_barrier() -> None:
    fake = FakeEpochs()
    run_epochs(fake, [3, 4, 5, 6])
    assert fake.order("acts") == [3, 4, 5, 6]
    for epoch in (4, 5, 6):
        assert fake.log.index(("acts", epoch)) > fake.log.index(("barrier", epoch - 1))


def test_the_next_epoch_starts_during_the_tail_not_after_the_end() -> None:
    fake = FakeEpochs()
    run_epochs(fake, [0, 1, 2])
    for epoch in (1, 2):
        # Set up (its Prefect run created) before the previous epoch's barrier.
        assert fake.log.index(("started", epoch)) < fake.log.index(("barrier", epoch - 1))


def test_without_a_tail_the_next_epoch_starts_when_the_previous_ends() -> None:
    fake = FakeEpochs(body=lambda epoch, gate: time.sleep(0.01))
    run_epochs(fake, [0, 1, 2])
    assert fake.order("acts") == [0, 1, 2]
    for epoch in (1, 2):
        assert fake.log.index(("started", epoch)) > fake.log.index(("barrier", epoch - 1))


def test_a_failed_epoch_stops_the_run_and_the_next_one_never_acts() -> None:
    def body(epoch: int, gate: EpochGate) -> None:
        gate.tail()
        time.sleep(0.05)
        if epoch == 1:
            raise ValueError("epoch 1 broke")

    fake = FakeEpochs(body)
    with pytest.raises(ValueError, match="epoch 1 broke"):
        run_epochs(fake, [0, 1, 2, 3])
    assert fake.order("acts") == [0, 1]
    assert 2 in fake.order("started")  # set up during 1's tail, then gave up
    assert 3 not in fake.order("started")


def test_an_epoch_that_returns_without_its_barrier_is_an_error() -> None:
    def run_epoch(epoch: int) -> None:
        gate = current_gate()
        assert gate is not None
        gate.wait_previous()
        if epoch == 0:
            gate.passed.set()

    with pytest.raises(RuntimeError, match="epoch 1 ended without passing its barrier"):
        run_epochs(run_epoch, [0, 1, 2])


def test_epochs_run_in_the_callers_context() -> None:
    seen: list[str] = []

    def run_epoch(epoch: int) -> None:
        seen.append(CALLER.get())
        gate = current_gate()
        assert gate is not None
        gate.passed.set()

    token = CALLER.set("train flow")
    try:
        run_epochs(run_epoch, [0, 1])
    finally:
        CALLER.reset(token)
    assert seen == ["train flow", "train flow"]
    assert current_gate() is None  # the caller's own context is untouched


def test_no_epochs_is_a_no_op() -> None:
    run_epochs(lambda epoch: pytest.fail("called"), [])


def test_a_gate_gives_up_waiting_when_the_run_stops() -> None:
    previous, abort = threading.Event(), threading.Event()
    gate = EpochGate(epoch=7, previous=previous, abort=abort, on_tail=lambda: None)
    threading.Timer(0.05, abort.set).start()
    with pytest.raises(RunStopping, match="epoch 7 not finished"):
        gate.wait_previous()


def test_a_gate_must_wait_only_until_the_previous_barrier() -> None:
    previous = threading.Event()
    gate = EpochGate(epoch=1, previous=previous, abort=threading.Event(), on_tail=lambda: None)
    assert gate.must_wait()
    previous.set()
    assert not gate.must_wait()
    first = EpochGate(epoch=0, previous=None, abort=threading.Event(), on_tail=lambda: None)
    assert not first.must_wait()


def test_the_tail_is_signalled_once() -> None:
    calls: list[int] = []
    gate = EpochGate(
        epoch=0, previous=None, abort=threading.Event(), on_tail=lambda: calls.append(1)
    )
    gate.tail()
    gate.tail()
    assert calls == [1]


def test_an_interrupt_stops_the_draining_epoch_and_is_raised() -> None:
    import _thread

    stopped: list[str] = []

    def run_epoch(epoch: int) -> None:
        gate = current_gate()
        assert gate is not None
        gate.wait_previous()
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:  # draining: checks at every result
                gate.check()
                time.sleep(0.01)
        except RunStopping as exc:
            stopped.append(str(exc))
            raise
        gate.passed.set()

    # Ctrl-C in the train flow. Python's own handler, as in a terminal: a suite started in
    # the background by a shell without job control inherits SIGINT ignored, and then
    # interrupt_main does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, _thread.interrupt_main).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            run_epochs(run_epoch, [0, 1])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped == ["epoch 0 not finished: the run is stopping"]
    assert time.monotonic() - started < 5

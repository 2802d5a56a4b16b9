"""A worker's base reads: in the background, a pinned one kept, a failed one never kept."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vcdl.types import StateDict
from vcdl.worker.basecache import OVERLAP_ENV, BaseKey, BaseReads, keep_decision, overlap_enabled
from vcdl.worker.slots import TrainingSlots


def key(version: int, run: str = "r") -> BaseKey:
    return (run, version, f"runs/{run}/versions/{version}", f"sum{version}")


class Reader:
    """A read that counts its calls and may be held until released, or fail."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self) -> StateDict:
        self.calls += 1
        self.gate.wait(10)
        if self.fail:
            raise OSError("store unreachable")
        return {"w": torch.full((3,), float(self.calls))}


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=30))
def test_a_kept_base_is_read_once_per_change_of_pinned_version(
    asks: list[tuple[int, bool]],
) -> None:
    kept: BaseKey | None = None
    reads = 0
    for version, pinned in asks:
        decision = keep_decision(kept, key(version), pinned)
        if decision != "use":
            reads += 1
        if decision == "replace":
            kept = key(version)
        # Only a pinned base is ever used from what is kept, and only its own key.
        assert decision != "use" or (pinned and kept == key(version))
        assert pinned or decision == "once"
    expected = 0
    last: BaseKey | None = None
    for version, pinned in asks:
        if not pinned or last != key(version):
            expected += 1
        if pinned:
            last = key(version)
    assert reads == expected


def test_the_pinned_base_is_read_once_for_the_epoch() -> None:
    bases, read = BaseReads(), Reader()
    first, fresh = bases.start(key(1), read, pinned=True)
    second, again = bases.start(key(1), read, pinned=True)
    assert fresh and not again and first is second
    a, _ = first.wait()
    b, _ = second.wait()
    assert read.calls == 1 and a is b and bases.kept() == key(1)
    assert first.read_seconds >= 0


def test_a_new_version_replaces_the_kept_one() -> None:
    bases, read = BaseReads(), Reader()
    bases.start(key(1), read, pinned=True)[0].wait()
    bases.start(key(2), read, pinned=True)[0].wait()
    assert bases.kept() == key(2) and read.calls == 2
    bases.start(key(1), read, pinned=True)[0].wait()
    assert read.calls == 3


def test_a_head_read_at_claim_is_never_kept() -> None:
    bases, read = BaseReads(), Reader()
    bases.start(key(1), read, pinned=False)[0].wait()
    bases.start(key(1), read, pinned=False)[0].wait()
    assert read.calls == 2 and bases.kept() is None


def test_the_wait_is_what_remains_of_a_read_in_flight() -> None:
    bases, read = BaseReads(), Reader()
    read.gate.clear()
    reading, _ = bases.start(key(1), read, pinned=True)
    threading.Timer(0.2, read.gate.set).start()
    state, waited = reading.wait()
    assert waited >= 0.15 and state["w"][0] == 1.0
    # Once there, the next attempt waits for nothing.
    _, waited_again = bases.start(key(1), read, pinned=True)[0].wait()
    assert waited_again < 0.05


def test_a_failed_read_is_raised_to_its_waiter_and_not_kept() -> None:
    bases, failing = BaseReads(), Reader(fail=True)
    reading, _ = bases.start(key(1), failing, pinned=True)
    with pytest.raises(OSError, match="unreachable"):
        reading.wait()
    good = Reader()
    state, _ = bases.start(key(1), good, pinned=True)[0].wait()
    assert good.calls == 1 and state["w"][0] == 1.0


def test_a_replaced_read_in_flight_ends_for_its_waiter_and_is_dropped() -> None:
    bases, slow = BaseReads(), Reader()
    slow.gate.clear()
    old, _ = bases.start(key(1), slow, pinned=True)
    bases.start(key(2), Reader(), pinned=True)[0].wait()
    slow.gate.set()
    assert old.wait()[0]["w"][0] == 1.0
    assert bases.kept() == key(2)
    bases.clear()
    assert bases.kept() is None


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OVERLAP_ENV, raising=False)
    assert overlap_enabled()
    for off in ("0", "off", "false"):
        monkeypatch.setenv(OVERLAP_ENV, off)
        assert not overlap_enabled()
    monkeypatch.setenv(OVERLAP_ENV, "1")
    assert overlap_enabled()


def test_a_slot_handed_on_early_is_freed_once() -> None:
    slots = TrainingSlots()
    entered = threading.Event()

    def next_attempt() -> None:
        with slots.hold(1):
            entered.set()

    with slots.hold(1) as release:
        waiter = threading.Thread(target=next_attempt)
        waiter.start()
        assert not entered.wait(0.1)  # the slot is held
        release()
        assert entered.wait(5)  # handed on before the block ends
        release()  # a second call frees nothing
        waiter.join(5)
    # One slot still: two holders at once would not both get in.
    with slots.hold(1):
        other = threading.Thread(target=next_attempt)
        entered.clear()
        other.start()
        assert not entered.wait(0.1)
    other.join(5)
    assert entered.is_set()

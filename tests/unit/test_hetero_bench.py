"""The figures of benchmarks/hetero.py: time to a loss, busy fractions, the targets' verdicts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.hetero import (
    SYNC,
    busy_fractions,
    fastest_busy,
    level_table,
    time_to,
    verdicts,
)


def test_time_to_is_the_first_time_at_or_below_the_target() -> None:
    curve = [(30.0, 2.0), (10.0, 3.0), (20.0, 2.5), (40.0, 1.9)]
    assert time_to(curve, 2.5) == 20.0
    assert time_to(curve, 2.0) == 30.0
    assert time_to(curve, 1.0) is None
    assert time_to([], 1.0) is None


def test_busy_counts_overlapping_attempts_of_a_worker_once() -> None:
    spans = [
        ("a", 1.0, 0.0, 6.0),
        ("a", 1.0, 4.0, 8.0),  # Dask re-ran one: overlaps the first
        ("b", 0.5, 2.0, 4.0),
        ("b", 0.5, 9.0, 12.0),  # past the end: clipped
    ]
    got = busy_fractions(spans, 0.0, 10.0)
    assert got["a"] == (1.0, pytest.approx(0.8))
    assert got["b"] == (0.5, pytest.approx(0.3))
    assert fastest_busy(got) == pytest.approx(0.8)
    assert fastest_busy({}) is None


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["w0", "w1", "w2"]),
            st.floats(0, 100, allow_nan=False),
            st.floats(0, 100, allow_nan=False),
        ),
        max_size=20,
    )
)
def test_busy_fractions_lie_in_0_1(raw: list[tuple[str, float, float]]) -> None:
    spans = [(w, 1.0, min(a, b), max(a, b)) for w, a, b in raw]
    for _, busy in busy_fractions(spans, 10.0, 60.0).values():
        assert 0.0 <= busy <= 1.0 + 1e-12


def _run(loss: float, curve: list[tuple[float, float]], busy: float = 0.5) -> dict[str, Any]:
    return {
        "loss": loss,
        "curve": curve,
        "fastest_busy": busy,
        "staleness": 1.0,
        "span_s": curve[-1][0],
        "wall_s": curve[-1][0] + 5,
    }


def test_level_table_and_the_h3_verdicts() -> None:
    rows = {
        SYNC: [_run(2.0, [(50.0, 2.5), (100.0, 2.0)])],
        "defaults": [_run(1.98, [(20.0, 2.4), (40.0, 1.98)], busy=0.95)],
        "delta": [_run(2.2, [(30.0, 2.3), (60.0, 2.2)])],
    }
    table = level_table(rows, [1.97])
    assert table[SYNC]["time_ratio"] == 1.0
    assert table["defaults"]["time_to_sync_s"] == 40.0
    assert table["defaults"]["time_ratio"] == 0.4
    assert table["delta"]["time_ratio"] is None  # never reached the synchronous loss
    v = verdicts("H3", table)
    assert v["best"] == "defaults" and v["best_not_worse_than_sync"]
    assert v["within_1pct"] and v["time_ratio_met"] and v["busy_met"]
    # Below H3 only the losses are judged.
    assert "time_ratio_met" not in verdicts("H1", table)


def test_verdicts_say_missed() -> None:
    rows = {
        SYNC: [_run(2.0, [(100.0, 2.0)])],
        "defaults": [_run(2.1, [(40.0, 2.1)], busy=0.5)],
    }
    v = verdicts("H3", level_table(rows, [1.9]))
    assert not v["best_not_worse_than_sync"] and not v["within_1pct"]
    assert not v["time_ratio_met"] and not v["busy_met"]

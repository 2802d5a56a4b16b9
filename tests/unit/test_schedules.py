"""Tests for vcdl.merge.schedules: end points, formulas, monotonicity, errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vcdl.errors import ConfigError
from vcdl.merge import SCHEDULES, alpha_schedule

PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

unit = st.floats(0.0, 1.0)
epochs_st = st.integers(1, 300)


def curve(kind: str, epochs: int, a: float, b: float) -> list[float]:
    return [alpha_schedule(kind, e, epochs, a, alpha_end=b) for e in range(epochs)]


def test_schedules_names() -> None:
    assert SCHEDULES == ("constant", "linear", "cosine", "list")


@PROPS
@given(unit, epochs_st, st.data())
def test_constant(alpha: float, epochs: int, data: st.DataObject) -> None:
    epoch = data.draw(st.integers(0, epochs - 1))
    assert alpha_schedule("constant", epoch, epochs, alpha) == alpha
    assert alpha_schedule("constant", epoch, epochs, alpha, alpha_end=0.3) == alpha


@PROPS
@given(st.sampled_from(["linear", "cosine"]), unit, unit, epochs_st)
# alpha_end - alpha does not round-trip here: alpha + (end - alpha) * 1 != end.
@example(kind="linear", a=0.1, b=0.7, epochs=2)
@example(kind="cosine", a=1e-300, b=1.0, epochs=3)
def test_end_points_are_exact(kind: str, a: float, b: float, epochs: int) -> None:
    values = curve(kind, epochs, a, b)
    assert values[0] == a
    assert values[-1] == (a if epochs == 1 else b)


@PROPS
@given(st.sampled_from(["linear", "cosine"]), unit, unit, epochs_st)
@example(kind="linear", a=0.5, b=0.5 + 2**-53, epochs=200)
@example(kind="cosine", a=0.3, b=0.3, epochs=100)
def test_monotone_between_end_points(kind: str, a: float, b: float, epochs: int) -> None:
    values = curve(kind, epochs, a, b)
    assert all(min(a, b) <= v <= max(a, b) for v in values)
    if a <= b:
        assert values == sorted(values)
    else:
        assert values == sorted(values, reverse=True)


@PROPS
@given(unit, unit, st.integers(2, 300), st.data())
def test_formulas(a: float, b: float, epochs: int, data: st.DataObject) -> None:
    e = data.draw(st.integers(0, epochs - 1))
    t = e / (epochs - 1)
    linear = a + (b - a) * t
    cosine = b + (a - b) * (1 + math.cos(math.pi * t)) / 2
    assert alpha_schedule("linear", e, epochs, a, alpha_end=b) == pytest.approx(linear, abs=1e-15)
    assert alpha_schedule("cosine", e, epochs, a, alpha_end=b) == pytest.approx(cosine, abs=1e-15)


def test_known_values() -> None:
    assert alpha_schedule("linear", 2, 5, 0.5, alpha_end=0.9) == pytest.approx(0.7)
    assert alpha_schedule("cosine", 1, 3, 0.5, alpha_end=0.9) == pytest.approx(0.7)  # midpoint
    assert alpha_schedule("cosine", 1, 5, 0.0, alpha_end=1.0) == pytest.approx(
        (1 - math.cos(math.pi / 4)) / 2
    )
    # One epoch: the start value, whatever the end.
    assert alpha_schedule("linear", 0, 1, 0.2, alpha_end=0.9) == 0.2
    assert alpha_schedule("cosine", 0, 1, 0.2, alpha_end=0.9) == 0.2


def test_list_indexing_and_last_value_repeats() -> None:
    alphas = [0.5, 0.6, 0.9]
    got = [alpha_schedule("list", e, 6, 0.1, alphas=alphas) for e in range(6)]
    assert got == [0.5, 0.6, 0.9, 0.9, 0.9, 0.9]
    assert alpha_schedule("list", 0, 1, 0.1, alphas=(0.25,)) == 0.25


@PROPS
@given(st.lists(unit, min_size=1, max_size=20), epochs_st, st.data())
def test_list_property(alphas: list[float], epochs: int, data: st.DataObject) -> None:
    e = data.draw(st.integers(0, epochs - 1))
    assert alpha_schedule("list", e, epochs, 0.5, alphas=alphas) == alphas[min(e, len(alphas) - 1)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "step"}, "allowed: constant, linear, cosine, list"),
        ({"alpha": 1.5}, r"alpha must be .*\[0, 1\]"),
        ({"alpha": -0.1}, "alpha must"),
        ({"alpha": math.nan}, "alpha must"),
        ({"alpha": "high"}, "alpha must"),
        ({"kind": "linear", "alpha_end": 2.0}, "alpha_end must"),
        ({"kind": "linear"}, "needs alpha_end"),
        ({"kind": "cosine"}, "needs alpha_end"),
        ({"kind": "list"}, "non-empty alphas"),
        ({"kind": "list", "alphas": []}, "non-empty alphas"),
        ({"kind": "list", "alphas": [0.5, 1.2]}, r"alphas\[1\] must"),
        ({"epoch": 10}, r"epoch must be an integer in \[0, 10\)"),
        ({"epoch": -1}, "epoch must"),
        ({"epoch": 1.0}, "epoch must"),
        ({"epochs": 0, "epoch": 0}, "epochs must be an integer >= 1"),
    ],
)
def test_errors(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"kind": "constant", "epoch": 0, "epochs": 10, "alpha": 0.5}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        alpha_schedule(**args)  # type: ignore[arg-type]


def test_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        alpha_schedule("nope", 0, 1, 0.5)


def test_cosine_stays_in_bounds_when_its_weight_rounds_to_one() -> None:
    # With 10^9 epochs, (1 - cos(pi t))/2 at the second-to-last epoch is exactly
    # 1.0, and a + (b - a) * 1.0 lands an ulp-ish below b for these values;
    # the clamp keeps the schedule within [b, a] and monotone.
    a, b, epochs = 0.8475463128056839, 1.7716026962194558e-06, 10**9
    assert a + (b - a) * 1.0 < b  # the raw formula escapes the interval
    penultimate = alpha_schedule("cosine", epochs - 2, epochs, a, alpha_end=b)
    assert b <= penultimate <= a
    assert penultimate >= alpha_schedule("cosine", epochs - 1, epochs, a, alpha_end=b)

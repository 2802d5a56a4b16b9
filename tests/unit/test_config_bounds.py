"""Every number a config takes is bounded: hostile or careless values fail validation
with one ConfigError naming the key, never a traceback and never accepted as NaN or inf."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from vcdl.config import RunConfig, parse_config
from vcdl.config_files import apply_overrides
from vcdl.errors import ConfigError

BASE: dict[str, Any] = {"data": {"name": "mnist1d"}, "model": {"factory": "cnn1d"}}


def numeric_keys() -> list[tuple[str, str]]:
    keys = []
    for section, field in RunConfig.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for key, f in model.model_fields.items():
            if any(t in str(f.annotation) for t in ("int", "float")):
                keys.append((section, key))
    return keys


KEYS = numeric_keys()


def with_value(section: str, key: str, value: Any) -> dict[str, Any]:
    data = {k: dict(v) for k, v in BASE.items()}
    data.setdefault(section, {})[key] = value
    return data


@pytest.mark.parametrize(("section", "key"), KEYS, ids=[f"{s}.{k}" for s, k in KEYS])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300, -1e300])
def test_non_finite_and_absurd_numbers_are_refused_naming_the_key(
    section: str, key: str, value: float
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(with_value(section, key, value))
    message = str(info.value)
    assert f"{section}.{key}" in message and "\n" not in message


values = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KEYS), values)
def test_any_value_is_accepted_finite_or_refused_in_one_line(
    section_key: tuple[str, str], value: Any
) -> None:
    section, key = section_key
    try:
        cfg = parse_config(with_value(section, key, value))
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    got = getattr(getattr(cfg, section), key)
    assert got is None or not isinstance(got, float) or math.isfinite(got)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_any_set_override_is_applied_or_refused_in_one_line(item: str) -> None:
    try:
        parse_config(apply_overrides({k: dict(v) for k, v in BASE.items()}, [item]))
    except ConfigError as exc:
        assert "\n" not in str(exc)


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, "run": {"name": "y" * 5000}})
    assert len(str(info.value)) < 300

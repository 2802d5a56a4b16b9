"""vcdl.merge.codec: reduced-precision results round-trip within their stated error."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.merge.codec import (
    SCALE_SUFFIX,
    check_stored,
    decode,
    encode,
    quantize_rows,
    stored_bytes,
    stored_names,
)

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)


def states(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[dict, dict]:
    gen = torch.Generator().manual_seed(seed)
    base = {
        "w": (torch.randn(shape, generator=gen) * 3).to(dtype),
        "n": torch.tensor(7),
        "mask": torch.tensor([True, False]),
    }
    change = torch.randn(shape, generator=gen) * 10 ** float(torch.randint(-5, 1, (1,)))
    result = {
        "w": (base["w"].float() + change).to(dtype),
        "n": torch.tensor(9),
        "mask": ~base["mask"],
    }
    return base, result


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 10**6), shape=shapes, dtype=st.sampled_from([torch.float32, torch.float64])
)
def test_bf16_changes_keep_8_bits_of_each_element(
    seed: int, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    base, result = states(seed, shape, dtype)
    got = decode(encode(result, base, "bf16_delta"), base, "bf16_delta")
    change = result["w"].double() - base["w"].double()
    err = (got["w"].double() - result["w"].double()).abs()
    # bfloat16 rounding (2^-9 of the change), then the float add rounding in the weight's dtype.
    ulp = torch.finfo(dtype).eps * got["w"].double().abs()
    assert bool((err <= change.abs() * 2.0**-8 + ulp + 1e-30).all())
    assert torch.equal(got["n"], result["n"]) and torch.equal(got["mask"], result["mask"])


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), shape=shapes)
def test_int8_changes_are_within_half_a_step_of_their_row(
    seed: int, shape: tuple[int, ...]
) -> None:
    base, result = states(seed, shape, torch.float32)
    stored = encode(result, base, "int8_delta")
    assert stored["w"].dtype == torch.int8 and stored["w"].shape == result["w"].shape
    scale = stored["w" + SCALE_SUFFIX]
    got = decode(stored, base, "int8_delta")
    change = result["w"].double() - base["w"].double()
    rows = scale.numel()
    per_row = change.reshape(rows, -1) if rows else change.reshape(0, 0)
    err = (got["w"].double() - result["w"].double()).reshape(per_row.shape).abs()
    bound = scale.double()[:, None] / 2 + torch.finfo(torch.float32).eps * 4 * (
        got["w"].double().abs().reshape(per_row.shape) + 1
    )
    assert bool((err <= bound).all())
    assert torch.equal(got["n"], result["n"])


def test_a_row_of_zeros_decodes_to_zeros_and_empties_survive() -> None:
    q, scale = quantize_rows(torch.zeros(3, 4))
    assert torch.equal(q, torch.zeros(3, 4, dtype=torch.int8)) and torch.equal(scale, torch.ones(3))
    for shape in [(0, 3), (3, 0), (0,), ()]:
        base = {"w": torch.zeros(shape)}
        for p in ("bf16_delta", "int8_delta"):
            assert decode(encode(base, base, p), base, p)["w"].shape == shape  # type: ignore[arg-type]


@pytest.mark.parametrize(("precision", "ratio"), [("bf16_delta", 1.99), ("int8_delta", 3.9)])
def test_results_shrink_at_least_as_promised(precision: str, ratio: float) -> None:
    # Integer tensors are stored exact: a counter keeps bf16 a hair under 2x.
    base = {f"layer{i}": torch.randn(256, 256) for i in range(4)} | {"n": torch.tensor(1)}
    result = {k: v + 0.01 if v.is_floating_point() else v for k, v in base.items()}
    stored = encode(result, base, precision)  # type: ignore[arg-type]
    assert stored_bytes(result) / stored_bytes(stored) >= ratio


def test_a_stored_result_that_is_not_the_encoding_is_named() -> None:
    base = {"w": (torch.float32, (4, 3)), "n": (torch.int64, ())}
    good = {"w": (torch.int8, (4, 3)), "w::scale": (torch.float32, (4,)), "n": (torch.int64, ())}
    assert check_stored(good, base, "int8_delta") is None
    no_scale = {"w": good["w"], "n": good["n"]}
    assert "missing ['w::scale']" in (check_stored(no_scale, base, "int8_delta") or "")
    bad = {**good, "w::scale": (torch.float32, (400,))}
    assert "expected torch.float32 [4]" in (check_stored(bad, base, "int8_delta") or "")
    assert "extra ['w::scale']" in (check_stored(good, base, "bf16_delta") or "")
    as_bf16 = {"w": (torch.float16, (4, 3)), "n": good["n"]}
    assert "expected torch.bfloat16" in (check_stored(as_bf16, base, "bf16_delta") or "")
    assert stored_names(["w", "n"], {"w": True, "n": False}, "int8_delta") == ["w", "w::scale", "n"]

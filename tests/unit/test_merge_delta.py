"""Property tests for the delta rule (vcdl.merge.delta) against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_merge import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    PROPS,
    alphas,
    assert_close,
    clone,
    np64,
    ref_other,
    state_lists,
)
from vcdl.errors import MergeError
from vcdl.merge import average, validate_result, validated_delta, vc_asgd
from vcdl.merge.delta import delta
from vcdl.types import StateDict

triples = state_lists(n=3)


def ref_delta(
    head: StateDict, result: StateDict, base: StateDict, alpha: float
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The float64 value per key, and the magnitude of the terms summed."""
    out, mag = {}, {}
    for k, h in head.items():
        r, b = result[k], base[k]
        if h.is_floating_point():
            beta = 1.0 - alpha
            out[k] = np64(h) + beta * (np64(r) - np64(b))
            mag[k] = np.abs(np64(h)) + beta * (np.abs(np64(r)) + np.abs(np64(b)))
        else:
            out[k] = ref_other([h, r])
            mag[k] = np.zeros(tuple(h.shape))
    return out, mag


@PROPS
@given(triples, alphas)
def test_delta_matches_the_reference_and_leaves_inputs_alone(
    states: list[StateDict], alpha: float
) -> None:
    head, result, base = states
    before = [clone(s) for s in states]
    out = delta(head, result, base, alpha)
    ref, mag = ref_delta(head, result, base, alpha)
    assert list(out) == list(head)
    for k, h in head.items():
        assert out[k].dtype == h.dtype and out[k].shape == h.shape
        assert_close(out[k], ref[k], mag[k], h.dtype)
    for s, b in zip(states, before, strict=True):
        for k in s:
            assert torch.equal(s[k], b[k])


@PROPS
@given(triples)
def test_alpha_one_returns_the_head_and_a_result_equal_to_its_base_changes_nothing(
    states: list[StateDict],
) -> None:
    head, result, base = states
    for out in (delta(head, result, base, 1.0), delta(head, base, base, 0.3)):
        for k, h in head.items():
            if h.is_floating_point():
                assert torch.equal(out[k], h), k


@PROPS
@given(state_lists(n=2, dtypes=(torch.float64,)), alphas)
def test_from_the_head_it_is_vc_asgd(pair: list[StateDict], alpha: float) -> None:
    head, result = pair
    out, ref = delta(head, result, head, alpha), vc_asgd(head, result, alpha)
    for k in head:
        assert torch.allclose(out[k], ref[k], rtol=1e-12, atol=1e-12), k


@PROPS
@given(state_lists(n=3, dtypes=(torch.float64,)))
def test_two_results_from_one_base_at_alpha_half_are_their_average(
    states: list[StateDict],
) -> None:
    # Local SGD: both results started from the same version; merged one
    # after the other with alpha 0.5, the head is their mean.
    base, r1, r2 = states
    mean = average([r1, r2])
    v1h = delta(base, r1, base, 0.5)
    v2h = delta(v1h, r2, base, 0.5)
    for k in base:
        assert torch.allclose(v2h[k], mean[k], rtol=1e-12, atol=1e-10), k


@PROPS
@given(triples, alphas)
def test_validated_delta_equals_delta_into_given_buffers(
    states: list[StateDict], alpha: float
) -> None:
    head, result, base = states
    out = {k: torch.empty_like(t) for k, t in head.items()}
    got = validated_delta(head, result, base, alpha, out=out)
    assert isinstance(got, dict)
    want = delta(head, result, base, alpha)
    for k in head:
        assert got[k] is out[k]
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_or_inf_in_the_result_is_a_reason_not_an_exception(dtype: torch.dtype) -> None:
    head = {"w": torch.zeros(4, dtype=dtype)}
    base = {"w": torch.ones(4, dtype=dtype)}
    for bad in (float("nan"), float("inf")):
        result = {"w": torch.tensor([0.0, bad, 0.0, 0.0], dtype=dtype)}
        reason = validated_delta(head, result, base, 0.5)
        assert isinstance(reason, str) and "'w'" in reason
        assert reason == validate_result(base, result)


def test_the_norm_bound_is_measured_from_the_results_own_base() -> None:
    head = {"w": torch.zeros(4)}
    base = {"w": torch.full((4,), 10.0)}
    result = {"w": torch.full((4,), 10.5)}  # 1.0 from its base, 21 from the head
    assert isinstance(validated_delta(head, result, base, 0.0, max_update_norm=2.0), dict)
    reason = validated_delta(head, result, base, 0.0, max_update_norm=0.5)
    assert isinstance(reason, str)
    assert reason == validate_result(base, result, 0.5)


def test_a_result_of_another_architecture_is_rejected_and_a_foreign_base_raises() -> None:
    head = {"w": torch.zeros(4), "n": torch.tensor(3)}
    wrong = {"w": torch.zeros(5), "n": torch.tensor(3)}
    assert isinstance(validated_delta(head, wrong, head, 0.5), str)
    with pytest.raises(MergeError, match="base"):
        validated_delta(head, head, wrong, 0.5)
    with pytest.raises(MergeError, match="alpha"):
        delta(head, head, head, 1.5)


def test_counters_take_the_max_and_narrow_floats_keep_their_dtype() -> None:
    head = {"n": torch.tensor(7), "w": torch.tensor([1.0], dtype=torch.bfloat16)}
    result = {"n": torch.tensor(9), "w": torch.tensor([1.0078125], dtype=torch.bfloat16)}
    base = {"n": torch.tensor(2), "w": torch.tensor([1.0], dtype=torch.bfloat16)}
    out = delta(head, result, base, 0.5)
    assert int(out["n"]) == 9
    # 1 + 0.5 * 2^-7 = 1 + 2^-8, a tie in bfloat16, rounded to even.
    assert out["w"].dtype == torch.bfloat16 and float(out["w"]) == 1.0


@PROPS
@given(st.sampled_from(ALL_DTYPES))
def test_out_overlapping_the_base_is_refused(dtype: torch.dtype) -> None:
    head = {"w": torch.zeros(3).to(dtype)}
    base = {"w": torch.ones(3).to(dtype)}
    with pytest.raises(MergeError, match="shares memory"):
        delta(head, head, base, 0.5, out=base)

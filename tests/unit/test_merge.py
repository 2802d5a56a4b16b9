"""Property tests for vcdl.merge, checked against a naive float64 reference.

The reference implementations below loop over keys in Python and do the
arithmetic in numpy float64: slow and obviously right, so the optimized
torch code is compared with them within the rounding of each dtype (as
nanochat checks its AdamW against torch's).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from vcdl.errors import MergeError
from vcdl.merge import (
    STALENESS_POLICIES,
    average,
    diloco,
    easgd,
    scale_result,
    staleness_alpha,
    state_norm,
    update_norm,
    validate_result,
    validated_vc_asgd,
    vc_asgd,
)
from vcdl.types import StateDict

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
ALL_DTYPES = (*FLOAT_DTYPES, torch.int64, torch.bool)

# Relative tolerance per dtype, applied to the magnitude of the terms summed
# (not the result, which may cancel to ~0): a few roundings for float32 and
# float64; for float16/bfloat16 exactly ONE final rounding (unit roundoff
# 2^-11 / 2^-8) plus float32 noise, which is what computing in float32 and
# casting back buys; rounding every intermediate in the narrow dtype fails it.
RTOL = {
    torch.float64: 1e-13,
    torch.float32: 1e-6,
    torch.float16: 2.0**-11 + 1e-6,
    torch.bfloat16: 2.0**-8 + 1e-6,
}

# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------

shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)  # () is 0-d, 0 is empty
alphas = st.floats(0.0, 1.0)


@st.composite
def tensor_of(draw: st.DrawFn, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    if dtype.is_floating_point:
        vals = draw(st.lists(st.floats(-100.0, 100.0), min_size=n, max_size=n))
        return torch.tensor(vals, dtype=torch.float64).reshape(shape).to(dtype)
    if dtype == torch.bool:
        flags = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return torch.tensor(flags, dtype=torch.bool).reshape(shape)
    ints = draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n))
    return torch.tensor(ints, dtype=dtype).reshape(shape)


@st.composite
def state_lists(
    draw: st.DrawFn,
    n: int | st.SearchStrategy[int] = 2,
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES,
    min_keys: int = 1,
) -> list[StateDict]:
    """``n`` state dicts with the same keys, shapes and dtypes, random values."""
    count = n if isinstance(n, int) else draw(n)
    spec = draw(st.lists(st.tuples(st.sampled_from(dtypes), shapes), min_size=min_keys, max_size=5))
    return [
        {f"layer{i}.p": draw(tensor_of(dt, sh)) for i, (dt, sh) in enumerate(spec)}
        for _ in range(count)
    ]


def pairs(dtypes: tuple[torch.dtype, ...] = ALL_DTYPES) -> st.SearchStrategy[list[StateDict]]:
    return state_lists(n=2, dtypes=dtypes)


def clone(state: StateDict) -> StateDict:
    return {k: v.clone() for k, v in state.items()}


def reversed_order(state: StateDict) -> StateDict:
    return dict(reversed(list(state.items())))


def assert_same_state(a: StateDict, b: StateDict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


# --------------------------------------------------------------------------
# Naive references: per-key Python loops, numpy float64
# --------------------------------------------------------------------------


def ref_other(tensors: list[torch.Tensor]) -> np.ndarray:
    arrs = [t.numpy() for t in tensors]
    if tensors[0].dtype == torch.bool:
        return np.logical_or.reduce(arrs)
    return np.maximum.reduce(arrs)


def ref_vc_asgd(head: StateDict, result: StateDict, alpha: float) -> dict[str, np.ndarray]:
    out = {}
    for k in head:
        h, r = head[k], result[k]
        if h.is_floating_point():
            out[k] = alpha * np64(h) + (1.0 - alpha) * np64(r)
        else:
            out[k] = ref_other([h, r])
    return out


def ref_average(states: list[StateDict], weights: list[float]) -> dict[str, np.ndarray]:
    total = sum(weights)
    out = {}
    for k in states[0]:
        if states[0][k].is_floating_point():
            acc = np.zeros(tuple(states[0][k].shape))
            for s, w in zip(states, weights, strict=True):
                acc = acc + (w / total) * np64(s[k])
            out[k] = acc
        else:
            out[k] = ref_other([s[k] for s in states])
    return out


def ref_diloco(
    head: StateDict,
    result: StateDict,
    buf: StateDict | None,
    lr: float,
    mu: float,
    nesterov: bool,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    new, new_buf = {}, {}
    for k in head:
        h, r = head[k], result[k]
        if not h.is_floating_point():
            new[k] = ref_other([h, r])
            continue
        g = np64(h) - np64(r)
        b_prev = np.zeros_like(g) if buf is None else np64(buf[k])
        b = mu * b_prev + g
        step = g + mu * b if nesterov else b
        new[k] = np64(h) - lr * step
        new_buf[k] = b
    return new, new_buf


def assert_close(out: torch.Tensor, ref: np.ndarray, mag: np.ndarray, dtype: torch.dtype) -> None:
    """|out - ref| <= rtol * magnitude of the summed terms + smallest normal."""
    if not dtype.is_floating_point:
        assert np.array_equal(out.numpy(), ref)
        return
    err = np.abs(np64(out) - ref)
    tol = RTOL[dtype] * mag + torch.finfo(dtype).tiny
    assert np.all(err <= tol), (dtype, float(np.max(err - tol)))


# --------------------------------------------------------------------------
# vc_asgd
# --------------------------------------------------------------------------


@PROPS
@given(pairs())
def test_vc_asgd_alpha_one_returns_head(pair: list[StateDict]) -> None:
    head, result = pair
    out = vc_asgd(head, result, 1.0)
    for k, h in head.items():
        if h.is_floating_point():
            assert torch.equal(out[k], h), k
        else:
            assert np.array_equal(out[k].numpy(), ref_other([h, result[k]])), k


@PROPS
@given(pairs())
def test_vc_asgd_alpha_zero_returns_result(pair: list[StateDict]) -> None:
    head, result = pair
    out = vc_asgd(head, result, 0.0)
    for k, h in head.items():
        if h.is_floating_point():
            assert torch.equal(out[k], result[k]), k


@PROPS
@given(pairs(), alphas)
def test_vc_asgd_matches_reference(pair: list[StateDict], alpha: float) -> None:
    head, result = pair
    out = vc_asgd(head, result, alpha)
    ref = ref_vc_asgd(head, result, alpha)
    for k, h in head.items():
        mag = (
            alpha * np.abs(np64(h)) + (1 - alpha) * np.abs(np64(result[k]))
            if h.is_floating_point()
            else np.zeros(())
        )
        assert_close(out[k], ref[k], mag, h.dtype)


@PROPS
@given(pairs(), alphas)
def test_vc_asgd_preserves_structure_and_inputs(pair: list[StateDict], alpha: float) -> None:
    head, result = pair[0], reversed_order(pair[1])  # result's key order must not matter
    head_before, result_before = clone(head), clone(result)
    out = vc_asgd(head, result, alpha)
    assert list(out) == list(head)
    for k, h in head.items():
        assert out[k].dtype == h.dtype and out[k].shape == h.shape, k
        if out[k].numel():  # outputs are fresh memory, never views of the inputs
            assert out[k].data_ptr() not in (h.data_ptr(), result[k].data_ptr()), k
    assert_same_state(head, head_before)
    assert_same_state(result, result_before)


@PROPS
@given(state_lists(n=2, dtypes=FLOAT_DTYPES), alphas)
def test_vc_asgd_is_convex_combination(pair: list[StateDict], alpha: float) -> None:
    head, result = pair
    out = vc_asgd(head, result, alpha)
    for k, h in head.items():
        lo = np.minimum(np64(h), np64(result[k]))
        hi = np.maximum(np64(h), np64(result[k]))
        slack = RTOL[h.dtype] * np.maximum(np.abs(lo), np.abs(hi)) + torch.finfo(h.dtype).tiny
        o = np64(out[k])
        assert np.all(o >= lo - slack) and np.all(o <= hi + slack), k


def test_vc_asgd_integers_take_max_and_bools_or() -> None:
    head = {"n": torch.tensor(7), "v": torch.tensor([1, 9, -3]), "f": torch.tensor([True, False])}
    result = {
        "n": torch.tensor(9),
        "v": torch.tensor([4, 2, -5]),
        "f": torch.tensor([False, False]),
    }
    for alpha in (0.0, 0.5, 1.0):
        out = vc_asgd(head, result, alpha)
        assert out["n"].item() == 9
        assert out["v"].tolist() == [4, 9, -3]
        assert out["f"].tolist() == [True, False]


def test_vc_asgd_on_a_real_model_state() -> None:
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(  # noqa: E731
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2)
    )
    a, b = make(), make()
    b.train()
    b(torch.randn(8, 4))  # bumps num_batches_tracked and the running stats
    head, result = a.state_dict(), b.state_dict()
    out = vc_asgd(head, result, 0.25)
    assert out["1.num_batches_tracked"].item() == 1
    expected = 0.25 * head["0.weight"] + 0.75 * result["0.weight"]
    torch.testing.assert_close(out["0.weight"], expected)
    a.load_state_dict(out)  # loads without complaint: keys, shapes, dtypes intact


def test_vc_asgd_does_not_track_gradients() -> None:
    head = {"w": torch.randn(3, requires_grad=True)}
    result = {"w": torch.randn(3, requires_grad=True)}
    out = vc_asgd(head, result, 0.5)
    assert not out["w"].requires_grad


@pytest.mark.parametrize("alpha", [-0.1, 1.000001, math.nan, math.inf, -math.inf, "x", None])
def test_vc_asgd_rejects_bad_alpha(alpha: object) -> None:
    head = {"w": torch.zeros(2)}
    with pytest.raises(MergeError, match="alpha"):
        vc_asgd(head, clone(head), alpha)  # type: ignore[arg-type]


@PROPS
@given(state_lists(n=2, min_keys=2), st.data())
def test_vc_asgd_missing_or_extra_key_raises_naming_it(
    pair: list[StateDict], data: st.DataObject
) -> None:
    head, result = pair
    key = data.draw(st.sampled_from(sorted(head)))
    missing = {k: v for k, v in result.items() if k != key}
    with pytest.raises(MergeError, match=rf"missing from result: \[.*'{key}'"):
        vc_asgd(head, missing, 0.5)
    extra = {**result, "stray.bias": torch.zeros(1)}
    with pytest.raises(MergeError, match=r"extra in result: \['stray.bias'\]"):
        vc_asgd(head, extra, 0.5)


def test_key_set_error_lists_at_most_five_keys() -> None:
    head = {f"k{i}": torch.zeros(1) for i in range(9)}
    with pytest.raises(MergeError) as info:
        vc_asgd(head, {"other": torch.zeros(1)}, 0.5)
    msg = str(info.value)
    assert "'k0'" in msg and "'k4'" in msg and "'k5'" not in msg
    assert "(+4 more)" in msg and "extra in result: ['other']" in msg


@PROPS
@given(pairs(), st.data())
def test_vc_asgd_shape_mismatch_raises_naming_key(
    pair: list[StateDict], data: st.DataObject
) -> None:
    head, result = pair
    key = data.draw(st.sampled_from(sorted(head)))
    bad = {**result, key: torch.zeros((*head[key].shape, 2), dtype=head[key].dtype)}
    with pytest.raises(MergeError, match=rf"shape mismatch at '{key}'"):
        vc_asgd(head, bad, 0.5)


@PROPS
@given(pairs(), st.data())
def test_vc_asgd_dtype_mismatch_raises_naming_key(
    pair: list[StateDict], data: st.DataObject
) -> None:
    head, result = pair
    key = data.draw(st.sampled_from(sorted(head)))
    other = data.draw(st.sampled_from([d for d in ALL_DTYPES if d != head[key].dtype]))
    bad = {**result, key: result[key].to(other)}
    with pytest.raises(MergeError, match=rf"dtype mismatch at '{key}'"):
        vc_asgd(head, bad, 0.5)


def test_vc_asgd_rejects_unsupported_dtype_and_non_tensor() -> None:
    c = {"z": torch.zeros(2, dtype=torch.complex64)}
    with pytest.raises(MergeError, match=r"unsupported dtype .* at 'z'"):
        vc_asgd(c, clone(c), 0.5)
    with pytest.raises(MergeError, match=r"result\['w'\] is a list"):
        vc_asgd({"w": torch.zeros(2)}, {"w": [0.0, 0.0]}, 0.5)  # type: ignore[dict-item]


def test_merge_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        vc_asgd({"w": torch.zeros(1)}, {}, 0.5)


# --------------------------------------------------------------------------
# vc_asgd into caller buffers; validated_vc_asgd (the assimilator's path)
# --------------------------------------------------------------------------


def empty_like(state: StateDict) -> StateDict:
    return {k: torch.full_like(t, 7) for k, t in state.items()}


@PROPS
@given(pairs(), alphas)
def test_vc_asgd_into_out_equals_fresh_and_keeps_inputs(
    pair: list[StateDict], alpha: float
) -> None:
    head, result = pair
    head_before, result_before = clone(head), clone(result)
    out = empty_like(head)
    got = vc_asgd(head, result, alpha, out=out)
    assert_same_state(got, vc_asgd(head, result, alpha))  # the same arithmetic, bit for bit
    for k, t in got.items():
        assert t is out[k] or t.data_ptr() == out[k].data_ptr(), k  # written in place
    assert_same_state(head, head_before)
    assert_same_state(result, result_before)


def test_vc_asgd_refuses_outputs_that_do_not_fit_or_overlap() -> None:
    head = {"w": torch.randn(4), "n": torch.tensor(3)}
    result = clone(head)
    with pytest.raises(MergeError, match="shares memory"):
        vc_asgd(head, result, 0.5, out=head)
    with pytest.raises(MergeError, match="shares memory"):
        vc_asgd(head, result, 0.5, out={"w": result["w"][:], "n": torch.tensor(0)})
    with pytest.raises(MergeError, match="shape mismatch at 'w'"):
        vc_asgd(head, result, 0.5, out={"w": torch.zeros(5), "n": torch.tensor(0)})
    with pytest.raises(MergeError, match="missing from out"):
        vc_asgd(head, result, 0.5, out={"w": torch.zeros(4)})


@PROPS
@given(pairs(), alphas, st.sampled_from([None, 0.0, 10.0, 1e9]))
def test_validated_vc_asgd_agrees_with_validate_then_merge(
    pair: list[StateDict], alpha: float, bound: float | None
) -> None:
    head, result = pair
    head_before, result_before = clone(head), clone(result)
    got = validated_vc_asgd(head, result, alpha, bound, out=empty_like(head))
    reason = validate_result(head, result, bound)
    if reason is not None:
        assert got == reason
        return
    assert isinstance(got, dict) and list(got) == list(head)
    ref = ref_vc_asgd(head, result, alpha)
    for k, h in head.items():
        assert got[k].dtype == h.dtype and got[k].shape == h.shape, k
        mag = (
            alpha * np.abs(np64(h)) + (1 - alpha) * np.abs(np64(result[k]))
            if h.is_floating_point()
            else np.zeros(())
        )
        assert_close(got[k], ref[k], mag, h.dtype)
    assert_same_state(head, head_before)
    assert_same_state(result, result_before)


@PROPS
@given(pairs())
def test_validated_vc_asgd_ends_are_exact(pair: list[StateDict]) -> None:
    head, result = pair
    one = validated_vc_asgd(head, result, 1.0)
    zero = validated_vc_asgd(head, result, 0.0, out=empty_like(head))
    assert isinstance(one, dict) and isinstance(zero, dict)
    for k, h in head.items():
        if h.is_floating_point():
            assert torch.equal(one[k], h), k
            assert torch.equal(zero[k], result[k]), k


@PROPS
@given(
    state_lists(n=2, dtypes=FLOAT_DTYPES),
    st.data(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.sampled_from([None, 1e30]),
    st.sampled_from([0.0, 0.3, 1.0]),
)
def test_validated_vc_asgd_rejects_nan_and_inf_like_validate(
    pair: list[StateDict], data: st.DataObject, bad: float, bound: float | None, alpha: float
) -> None:
    head, result = pair
    keys = [k for k, t in head.items() if t.numel() > 0]
    assume(keys)
    corrupted = clone(result)
    for _ in range(data.draw(st.integers(1, 3))):  # maybe several bad keys: the first is named
        key = data.draw(st.sampled_from(keys))
        i = data.draw(st.integers(0, head[key].numel() - 1))
        corrupted[key].view(-1)[i] = bad
    reason = validated_vc_asgd(head, corrupted, alpha, bound, out=empty_like(head))
    assert isinstance(reason, str)
    assert reason == validate_result(head, corrupted, bound)


def test_validated_vc_asgd_does_not_overflow_where_vc_asgd_does_not() -> None:
    # lerp's result - head is 6e38 here, past float32; the product form is finite.
    head = {"w": torch.full((4,), -3e38), "b": torch.full((2,), -3e38, dtype=torch.bfloat16)}
    result = {"w": torch.full((4,), 3e38), "b": torch.full((2,), 3e38, dtype=torch.bfloat16)}
    got = validated_vc_asgd(head, result, 0.5, out=empty_like(head))
    assert isinstance(got, dict)
    assert_same_state(got, vc_asgd(head, result, 0.5))
    assert bool(torch.isfinite(got["w"]).all()) and bool(torch.isfinite(got["b"]).all())


def test_validated_vc_asgd_keeps_a_nan_head_like_vc_asgd() -> None:
    # validate_result without a bound looks at the result only; so does the fused check.
    head = {"w": torch.tensor([1.0, math.nan])}
    result = {"w": torch.tensor([2.0, 3.0])}
    got = validated_vc_asgd(head, result, 0.5)
    assert isinstance(got, dict)
    assert torch.equal(got["w"][:1], torch.tensor([1.5])) and math.isnan(float(got["w"][1]))


def test_validated_vc_asgd_on_large_mixed_tensors() -> None:
    gen = torch.Generator().manual_seed(3)
    head = {
        "conv": torch.randn(64, 32, 3, 3, generator=gen),  # 18K floats: a real-size tensor
        "half": torch.randn(5000, generator=gen).half(),
        "bf": torch.randn(70, 70, generator=gen).bfloat16(),
        "n": torch.tensor(4),
        "f": torch.tensor([True, False]),
    }
    result = {k: (t * 0.5 + 1 if t.is_floating_point() else t) for k, t in head.items()}
    for alpha in (0.0, 0.1, 0.7, 1.0):
        got = validated_vc_asgd(head, result, alpha, out=empty_like(head))
        assert isinstance(got, dict)
        ref = ref_vc_asgd(head, result, alpha)  # one final rounding, as vc_asgd
        for k, h in head.items():
            mag = alpha * np.abs(np64(h)) + (1 - alpha) * np.abs(np64(result[k]))
            assert_close(got[k], ref[k], mag, h.dtype)
    bad = clone(result)
    bad["conv"].view(-1)[12345] = math.inf
    assert validated_vc_asgd(head, bad, 0.5) == validate_result(head, bad)


def test_validated_vc_asgd_argument_errors() -> None:
    head = {"w": torch.zeros(2)}
    with pytest.raises(MergeError, match="alpha"):
        validated_vc_asgd(head, clone(head), 1.5)
    with pytest.raises(MergeError, match="max_update_norm"):
        validated_vc_asgd(head, clone(head), 0.5, max_update_norm=-1.0)
    with pytest.raises(MergeError, match="shares memory"):
        validated_vc_asgd(head, clone(head), 0.5, out=head)
    assert "shape mismatch" in str(validated_vc_asgd(head, {"w": torch.zeros(3)}, 0.5))


# --------------------------------------------------------------------------
# average
# --------------------------------------------------------------------------


@PROPS
@given(state_lists(n=1), st.integers(1, 4))
def test_average_of_identical_states_is_that_state(one: list[StateDict], n: int) -> None:
    (state,) = one
    assert_same_state(average([state] * n), state)
    assert_same_state(average([clone(state) for _ in range(n)], [0.3] * n), state)


@PROPS
@given(state_lists(n=1))
def test_average_of_one_state_is_a_copy(one: list[StateDict]) -> None:
    (state,) = one
    out = average([state], [2.5])
    assert_same_state(out, state)
    for k, t in state.items():
        if t.numel():
            assert out[k].data_ptr() != t.data_ptr(), k


@PROPS
@given(state_lists(n=st.integers(1, 4)), st.data())
def test_average_matches_reference(states: list[StateDict], data: st.DataObject) -> None:
    weights = data.draw(
        st.lists(st.floats(0.0, 10.0), min_size=len(states), max_size=len(states)).filter(
            lambda w: sum(w) > 1e-3
        )
    )
    before = [clone(s) for s in states]
    out = average(states, weights)
    ref = ref_average(states, weights)
    for k, t in states[0].items():
        mag = np.zeros(())
        if t.is_floating_point():
            # The running mean's error is a few ulps of the LARGEST input, not
            # of the weighted terms: a state whose weight is below 2^-53 of the
            # total is absorbed (found by hypothesis: weights [1.8e-220, 1.0]).
            mag = len(states) * np.max([np.abs(np64(s[k])) for s in states], axis=0)
        assert out[k].dtype == t.dtype and out[k].shape == t.shape
        assert_close(out[k], ref[k], mag, t.dtype)
    for s, b in zip(states, before, strict=True):
        assert_same_state(s, b)


def test_average_default_weights_are_equal() -> None:
    states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}]
    torch.testing.assert_close(average(states)["w"], torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(average(states, [3, 1])["w"], torch.tensor([1.5, 3.0]))
    # A zero weight drops a state from the mean but not from the checks.
    torch.testing.assert_close(average(states, [0, 1])["w"], torch.tensor([3.0, 6.0]))


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([1.0], "2 states"),
        ([1.0, -1.0], "weights"),
        ([0.0, 0.0], "positive sum"),
        ([1.0, math.nan], "weights"),
        ([1.0, math.inf], "weights"),
    ],
)
def test_average_rejects_bad_weights(weights: list[float], match: str) -> None:
    s = {"w": torch.zeros(2)}
    with pytest.raises(MergeError, match=match):
        average([s, clone(s)], weights)


def test_average_rejects_empty_and_mismatched_states() -> None:
    with pytest.raises(MergeError, match="at least one"):
        average([])
    a = {"w": torch.zeros(2), "b": torch.zeros(1)}
    with pytest.raises(MergeError, match=r"shape mismatch at 'w'.*states\[2\]"):
        average([a, clone(a), {"w": torch.zeros(3), "b": torch.zeros(1)}])


# --------------------------------------------------------------------------
# easgd
# --------------------------------------------------------------------------


@PROPS
@given(pairs(), alphas)
def test_easgd_equals_vc_asgd_with_one_minus_rho(pair: list[StateDict], rho: float) -> None:
    head, result = pair
    assert_same_state(easgd(head, result, rho), vc_asgd(head, result, 1.0 - rho))


def test_easgd_rejects_bad_rho() -> None:
    with pytest.raises(MergeError, match="rho"):
        easgd({"w": torch.zeros(1)}, {"w": torch.zeros(1)}, 1.5)


# --------------------------------------------------------------------------
# diloco
# --------------------------------------------------------------------------


@PROPS
@given(pairs())
def test_diloco_lr_one_no_momentum_returns_result(pair: list[StateDict]) -> None:
    head, result = pair
    for nesterov in (True, False):
        new, buf = diloco(head, result, None, lr=1.0, momentum=0.0, nesterov=nesterov)
        for k, h in head.items():
            if h.is_floating_point():
                mag = 2 * (np.abs(np64(h)) + np.abs(np64(result[k])))
                assert_close(new[k], np64(result[k]), mag, h.dtype)
            else:
                assert np.array_equal(new[k].numpy(), ref_other([h, result[k]]))
        assert set(buf) == {k for k, t in head.items() if t.is_floating_point()}


@PROPS
@given(
    state_lists(n=4),
    st.floats(0.0, 1.0),
    st.floats(0.0, 0.99),
    st.booleans(),
)
def test_diloco_matches_reference_over_steps(
    states: list[StateDict], lr: float, mu: float, nesterov: bool
) -> None:
    """Three outer steps, the buffer carried over, each against the float64 reference.

    Each step's reference starts from the same (rounded) head and buffer, so
    the per-step rounding of narrow dtypes does not accumulate.
    """
    head, results = states[0], states[1:]
    buf: StateDict | None = None
    for result in results:
        head_in, buf_in = clone(head), None if buf is None else clone(buf)
        inputs_before = clone(head_in), clone(result), None if buf is None else clone(buf)
        head, buf = diloco(head_in, result, buf_in, lr=lr, momentum=mu, nesterov=nesterov)
        assert_same_state(head_in, inputs_before[0])
        assert_same_state(result, inputs_before[1])
        if buf_in is not None and inputs_before[2] is not None:
            assert_same_state(buf_in, inputs_before[2])
        ref_new, ref_buf = ref_diloco(head_in, result, buf_in, lr, mu, nesterov)
        assert set(buf) == set(ref_buf)
        for k, h in head_in.items():
            if not h.is_floating_point():
                assert np.array_equal(head[k].numpy(), ref_new[k])
                continue
            prev_buf = 0.0 if buf_in is None else np.abs(np64(buf_in[k]))
            mag = 8 * (np.abs(np64(h)) + np.abs(np64(result[k])) + prev_buf) * (1 + lr)
            assert_close(head[k], ref_new[k], mag, h.dtype)
            buf_dtype = torch.float32 if h.dtype.itemsize < 4 else h.dtype
            assert buf[k].dtype == buf_dtype
            assert_close(buf[k], ref_buf[k], mag, buf_dtype)


def test_diloco_none_buffer_equals_zero_buffer_and_is_not_mutated() -> None:
    torch.manual_seed(1)
    head = {"w": torch.randn(4, 3), "n": torch.tensor(3)}
    result = {"w": torch.randn(4, 3), "n": torch.tensor(5)}
    zeros = {"w": torch.zeros(4, 3)}
    a_new, a_buf = diloco(head, result, None)
    b_new, b_buf = diloco(head, result, zeros)
    torch.testing.assert_close(a_new["w"], b_new["w"])
    torch.testing.assert_close(a_buf["w"], b_buf["w"])
    assert a_new["n"].item() == 5 and "n" not in a_buf
    assert torch.equal(zeros["w"], torch.zeros(4, 3))
    # The paper's rule by hand: g = h - r, buf = g, step = g + 0.9 g, new = h - 0.7 step.
    g = head["w"] - result["w"]
    torch.testing.assert_close(a_new["w"], head["w"] - 0.7 * (g + 0.9 * g))


def test_diloco_rejects_bad_arguments() -> None:
    head = {"w": torch.zeros(2), "n": torch.tensor(1)}
    result = clone(head)
    with pytest.raises(MergeError, match="momentum"):
        diloco(head, result, None, momentum=1.0)
    with pytest.raises(MergeError, match="lr"):
        diloco(head, result, None, lr=-0.1)
    with pytest.raises(MergeError, match="momentum_buf"):
        diloco(head, result, {"w": torch.zeros(2), "n": torch.zeros(1)})
    with pytest.raises(MergeError, match="shape mismatch at 'w'"):
        diloco(head, result, {"w": torch.zeros(3)})
    with pytest.raises(MergeError, match="missing from result"):
        diloco(head, {"w": torch.zeros(2)}, None)


# --------------------------------------------------------------------------
# scale_result
# --------------------------------------------------------------------------


@PROPS
@given(pairs())
def test_scale_result_end_points(pair: list[StateDict]) -> None:
    head, result = pair
    assert_same_state(scale_result(head, result, 1.0), result)
    zero = scale_result(head, result, 0.0)
    for k, h in head.items():
        expected = h if h.is_floating_point() else result[k]  # ints always from result
        assert torch.equal(zero[k], expected), k


@PROPS
@given(pairs(), alphas)
def test_scale_result_matches_reference(pair: list[StateDict], f: float) -> None:
    head, result = pair
    before = clone(head), clone(result)
    out = scale_result(head, result, f)
    for k, h in head.items():
        if h.is_floating_point():
            ref = np64(h) + f * (np64(result[k]) - np64(h))
            mag = 2 * (np.abs(np64(h)) + np.abs(np64(result[k])))
            assert_close(out[k], ref, mag, h.dtype)
        else:
            assert torch.equal(out[k], result[k])
    assert_same_state(head, before[0])
    assert_same_state(result, before[1])


def test_scale_result_rejects_bad_fraction() -> None:
    with pytest.raises(MergeError, match="fraction"):
        scale_result({"w": torch.zeros(1)}, {"w": torch.zeros(1)}, -0.5)


# --------------------------------------------------------------------------
# staleness_alpha
# --------------------------------------------------------------------------


@PROPS
@given(alphas, st.sampled_from(STALENESS_POLICIES), st.floats(0.0, 4.0))
def test_staleness_zero_keeps_alpha(alpha: float, policy: str, power: float) -> None:
    assert staleness_alpha(alpha, 0, policy, power) == alpha


@PROPS
@given(alphas, st.floats(0.0, 4.0), st.lists(st.integers(0, 10_000), min_size=2, max_size=6))
# 1 - (1 - 0.1) rounds to 0.09999999999999998 < 0.1: power 0 (or tiny) must not
# push alpha_eff below alpha.
@example(alpha=0.1, power=0.0, stalenesses=[0, 1, 5])
@example(alpha=0.1, power=1e-300, stalenesses=[1, 2])
def test_staleness_raise_is_monotone_and_bounded(
    alpha: float, power: float, stalenesses: list[int]
) -> None:
    values = [staleness_alpha(alpha, s, "raise", power) for s in sorted(stalenesses)]
    assert all(v is not None and alpha <= v <= 1.0 for v in values)
    assert values == sorted(values)  # type: ignore[type-var]


@PROPS
@given(alphas, st.integers(1, 1000), st.floats(0.1, 3.0))
def test_staleness_raise_formula(alpha: float, s: int, power: float) -> None:
    expected = 1.0 - (1.0 - alpha) / (1.0 + s) ** power
    got = staleness_alpha(alpha, s, "raise", power)
    assert got == pytest.approx(max(alpha, expected), abs=1e-12)


@PROPS
@given(alphas, st.integers(0, 50), st.integers(0, 50))
def test_staleness_reject_and_plain(alpha: float, s: int, max_s: int) -> None:
    assert staleness_alpha(alpha, s, "plain", max_staleness=max_s) == alpha
    assert staleness_alpha(alpha, s, "reject") == alpha
    rejected = staleness_alpha(alpha, s, "reject", max_staleness=max_s)
    assert rejected == (None if s > max_s else alpha)
    raised = staleness_alpha(alpha, s, "raise", max_staleness=max_s)
    assert (raised is None) == (s > max_s)


@PROPS
@given(alphas, st.integers(0, 1000), st.integers(0, 20), st.floats(0.0, 3.0))
def test_staleness_grace_shifts_the_raise_policy(
    alpha: float, s: int, grace: int, power: float
) -> None:
    got = staleness_alpha(alpha, s, "raise", power, grace=grace)
    # Up to the grace, undamped; beyond it, the raise policy of the excess.
    assert got == (alpha if s <= grace else staleness_alpha(alpha, s - grace, "raise", power))
    assert staleness_alpha(alpha, s, "raise", power, grace=0) == staleness_alpha(
        alpha, s, "raise", power
    )
    # plain and reject ignore it.
    assert staleness_alpha(alpha, s, "plain", power, grace=grace) == alpha
    assert staleness_alpha(alpha, s, "reject", power, grace=grace) == alpha


def test_staleness_alpha_errors() -> None:
    with pytest.raises(MergeError, match="staleness"):
        staleness_alpha(0.5, -1)
    with pytest.raises(MergeError, match="allowed: plain, raise, reject"):
        staleness_alpha(0.5, 1, "decay")
    with pytest.raises(MergeError, match="alpha"):
        staleness_alpha(1.5, 1)
    with pytest.raises(MergeError, match="power"):
        staleness_alpha(0.5, 1, "raise", power=-1.0)
    with pytest.raises(MergeError, match="max_staleness"):
        staleness_alpha(0.5, 1, "reject", max_staleness=-1)
    with pytest.raises(MergeError, match="grace"):
        staleness_alpha(0.5, 1, "raise", grace=-1)
    assert staleness_alpha(0.5, 3, "raise", power=1.0) == pytest.approx(0.875)


# --------------------------------------------------------------------------
# validate_result, norms
# --------------------------------------------------------------------------


@PROPS
@given(pairs())
def test_validate_accepts_good_results(pair: list[StateDict]) -> None:
    head, result = pair
    assert validate_result(head, result) is None
    assert validate_result(head, result, max_update_norm=math.inf) is None
    assert validate_result(head, result, max_update_norm=update_norm(head, result) * 1.001) is None


@PROPS
@given(
    state_lists(n=2, dtypes=FLOAT_DTYPES),
    st.data(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.sampled_from([None, 1e30]),
)
def test_validate_names_nan_and_inf(
    pair: list[StateDict], data: st.DataObject, bad: float, bound: float | None
) -> None:
    head, result = pair
    keys = [k for k, t in head.items() if t.numel() > 0]
    assume(keys)
    key = data.draw(st.sampled_from(keys))
    i = data.draw(st.integers(0, head[key].numel() - 1))
    corrupted = clone(result)
    corrupted[key].view(-1)[i] = bad
    reason = validate_result(head, corrupted, max_update_norm=bound)
    word = "1 NaN" if math.isnan(bad) else "1 Inf"
    assert reason is not None and f"result['{key}']" in reason and word in reason, reason


def test_validate_structural_problems() -> None:
    head = {"a.w": torch.zeros(2, 3), "a.n": torch.tensor(0)}
    ok = clone(head)
    assert validate_result(head, ok) is None
    cases = {
        "missing from result: ['a.n']": {"a.w": torch.zeros(2, 3)},
        "extra in result: ['x']": {**ok, "x": torch.zeros(1)},
        "shape mismatch at 'a.w'": {**ok, "a.w": torch.zeros(3, 2)},
        "dtype mismatch at 'a.w'": {**ok, "a.w": torch.zeros(2, 3, dtype=torch.float64)},
        "dtype mismatch at 'a.n'": {**ok, "a.n": torch.tensor(0, dtype=torch.int32)},
        "result['a.w'] is a ndarray": {**ok, "a.w": np.zeros((2, 3))},
    }
    for expected, result in cases.items():
        reason = validate_result(head, result)  # type: ignore[arg-type]
        assert reason is not None and expected in reason, (expected, reason)
        assert "\n" not in reason


def test_validate_norm_bound_gives_both_numbers() -> None:
    head = {"w": torch.zeros(4), "b": torch.zeros(1, dtype=torch.float16), "n": torch.tensor(1)}
    result = {"w": torch.full((4,), 1.5), "b": torch.full((1,), 2.0).half(), "n": torch.tensor(9)}
    # sqrt(4 * 1.5^2 + 2^2) = 3.6055...; the int tensor does not count.
    assert update_norm(head, result) == pytest.approx(math.sqrt(13.0))
    reason = validate_result(head, result, max_update_norm=3.0)
    assert reason == "update norm 3.60555 exceeds max_update_norm 3"
    assert validate_result(head, result, max_update_norm=3.7) is None
    with pytest.raises(MergeError, match="max_update_norm"):
        validate_result(head, result, max_update_norm=-1.0)


def test_validate_norm_overflow_is_rejected_not_crashed() -> None:
    head = {"w": torch.full((4,), -3e38)}
    result = {"w": torch.full((4,), 3e38)}
    reason = validate_result(head, result, max_update_norm=1e6)
    assert reason is not None and "overflows at 'w'" in reason
    assert validate_result(head, result) is None  # finite values, no bound: acceptable


@PROPS
@given(state_lists(n=1), state_lists(n=1), st.sampled_from([None, 0.0, 10.0, 1e9]))
def test_validate_never_raises_and_agrees_with_vc_asgd(
    a: list[StateDict], b: list[StateDict], bound: float | None
) -> None:
    """Arbitrary (often incompatible) pairs: a reason string or None, never an exception."""
    head, result = a[0], b[0]
    reason = validate_result(head, result, max_update_norm=bound)
    assert reason is None or (isinstance(reason, str) and "\n" not in reason)
    if bound is None:
        if reason is None:
            vc_asgd(head, result, 0.5)
        else:
            with pytest.raises(MergeError):
                vc_asgd(head, result, 0.5)


@PROPS
@given(pairs())
def test_norms_match_reference(pair: list[StateDict]) -> None:
    head, result = pair
    floats = [k for k, t in head.items() if t.is_floating_point()]
    ref_state = math.sqrt(sum(float(np.sum(np64(head[k]) ** 2)) for k in floats))
    ref_update = math.sqrt(
        sum(float(np.sum((np64(result[k]) - np64(head[k])) ** 2)) for k in floats)
    )
    assert state_norm(head) == pytest.approx(ref_state, rel=1e-5, abs=1e-30)
    assert update_norm(head, result) == pytest.approx(ref_update, rel=1e-5, abs=1e-30)


def test_update_norm_raises_on_mismatch() -> None:
    with pytest.raises(MergeError, match="shape mismatch at 'w'"):
        update_norm({"w": torch.zeros(2)}, {"w": torch.zeros(3)})

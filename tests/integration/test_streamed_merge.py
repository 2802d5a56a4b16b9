"""The streamed merge equals the in-memory merge bit for bit, for every rule and dtype.

``vcdl.driver.streamed`` merges a result read from the store a batch of
tensors at a time; every rule is elementwise, so its output (weights, the
rule's state, the version written) must be the bytes that ``rule.apply``
gives on the whole states. Also: a bad result is rejected with the same
reason and leaves no version behind; the norm bound is global, not per batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bitwise import assert_bitwise
from vcdl.config import MergeSection
from vcdl.driver.streamed import Decoded, streamed_check, streamed_merge
from vcdl.merge.codec import decode, encode
from vcdl.merge.rules import RULES, Applied, merge_rule
from vcdl.store import WeightStore
from vcdl.store.streaming import specs_of
from vcdl.types import StateDict

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def make_states(
    seed: int, dtype: torch.dtype, shapes: list[tuple[int, ...]]
) -> tuple[StateDict, StateDict, StateDict]:
    """Head, a result trained from ``base``, and the base: floats, a counter, a mask."""
    gen = torch.Generator().manual_seed(seed)

    def state(shift: float) -> StateDict:
        s: StateDict = {}
        for i, shape in enumerate(shapes):
            s[f"w{i}"] = (torch.randn(shape, generator=gen) + shift).to(dtype)
        s["bn.num_batches_tracked"] = torch.tensor(int(100 + 10 * shift))
        s["mask"] = torch.rand(7, generator=gen) > 0.5
        return s

    return state(0.0), state(0.3), state(0.1)


def merge_both(
    tmp: Path, rule_name: str, dtype: torch.dtype, bound: float | None, batch: int, seed: int = 0
) -> None:
    settings_ = MergeSection(rule=rule_name, max_update_norm=bound)  # type: ignore[arg-type]
    rule = merge_rule(settings_)
    shapes = [(300, 70), (5,), (), (0, 3), (1000,), (40, 40, 3)]
    head, result, base = make_states(seed, dtype, shapes)
    state = None
    if rule.keeps_state:  # a momentum from an earlier merge
        first = merge_rule(MergeSection(rule=rule_name)).apply(head, result, 0.4, base=base)  # type: ignore[arg-type]
        assert isinstance(first, Applied) and first.state is not None
        state = first.state
    want = rule.apply(head, result, 0.35, base=base, state=state)
    store = WeightStore(str(tmp / f"store-{rule_name}-{seed}"))
    store.write_state("result", result)
    store.write_state("base", base)
    for base_in in ("memory", "store"):
        path = f"v-{base_in}"
        got = streamed_merge(
            rule,
            head,
            store.reader("result"),
            0.35,
            lambda path=path: store.writer(path, specs_of(head)),  # type: ignore[misc]
            base=(base if base_in == "memory" else store.reader("base"))
            if rule.reads_base
            else None,
            state=state,
            batch_bytes=batch,
        )
        if isinstance(want, str):
            assert got.applied is None and got.reason == want
            assert not store.exists(path)
            continue
        assert got.applied is not None, got.reason
        assert_bitwise(got.applied.weights, want.weights)
        assert_bitwise(store.read_state(path), want.weights)
        assert got.checksum == store.checksum(path)
        if want.state is not None:
            assert got.applied.state is not None
            assert_bitwise({k: got.applied.state[k] for k in want.state}, want.state)


@pytest.mark.parametrize("rule_name", sorted(RULES))
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).removeprefix("torch."))
def test_streamed_equals_in_memory(tmp_path: Path, rule_name: str, dtype: torch.dtype) -> None:
    # 20 kB batches: many batches, and the 300x70 and 40x40x3 tensors in rows.
    merge_both(tmp_path, rule_name, dtype, bound=None, batch=20_000)


@pytest.mark.parametrize("rule_name", ["vc_asgd", "delta", "diloco"])
@pytest.mark.parametrize("bound", [1e9, 1.0], ids=["loose-bound", "tight-bound"])
def test_the_norm_bound_is_global_and_rejects_like_in_memory(
    tmp_path: Path, rule_name: str, bound: float
) -> None:
    merge_both(tmp_path, rule_name, torch.float32, bound=bound, batch=20_000)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    rule_name=st.sampled_from(sorted(RULES)),
    dtype=st.sampled_from(FLOATS),
    batch=st.integers(1, 200_000),
)
def test_any_batch_size_gives_the_same_bytes(
    tmp_path: Path, seed: int, rule_name: str, dtype: torch.dtype, batch: int
) -> None:
    merge_both(tmp_path, rule_name, dtype, bound=None, batch=batch, seed=seed)


def test_a_result_with_nan_is_rejected_and_leaves_no_version(tmp_path: Path) -> None:
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head, result, _ = make_states(0, torch.float32, [(50, 50), (2000,)])
    result["w1"][7] = float("nan")
    store = WeightStore(str(tmp_path / "s"))
    store.write_state("result", result)
    got = streamed_merge(
        rule,
        head,
        store.reader("result"),
        0.5,
        lambda: store.writer("v", specs_of(head)),
        batch_bytes=4_000,
    )
    assert got.applied is None and got.reason is not None and "NaN" in got.reason
    assert not store.exists("v") and store.list("") == ["result"]
    assert streamed_check(rule, head, store.reader("result")) == got.reason


def test_a_result_of_another_model_is_rejected_before_anything_is_written(
    tmp_path: Path,
) -> None:
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head, result, _ = make_states(0, torch.float32, [(50, 50)])
    result["w0"] = torch.zeros(50, 49)
    store = WeightStore(str(tmp_path / "s"))
    store.write_state("result", result)
    opened = []
    got = streamed_merge(
        rule,
        head,
        store.reader("result"),
        0.5,
        lambda: opened.append(1),  # type: ignore[arg-type,return-value]
    )
    assert got.applied is None and "shape mismatch at 'w0'" in (got.reason or "")
    assert opened == []


@pytest.mark.parametrize("precision", ["bf16_delta", "int8_delta"])
@pytest.mark.parametrize("rule_name", ["vc_asgd", "delta"])
@pytest.mark.parametrize("batch", [4_000, 1 << 30], ids=["rows", "one-batch"])
def test_a_reduced_result_streams_in_rows_as_it_decodes_whole(
    tmp_path: Path, precision: str, rule_name: str, batch: int
) -> None:
    # The int8 scales are one per row: rows of a tensor decode with their own.
    rule = merge_rule(MergeSection(rule=rule_name))  # type: ignore[arg-type]
    head, result, base = make_states(3, torch.float32, [(300, 70), (5,), (40, 40, 3)])
    stored = encode(result, base, precision)  # type: ignore[arg-type]
    want = rule.apply(head, decode(stored, base, precision), 0.35, base=base)  # type: ignore[arg-type]
    assert isinstance(want, Applied)
    store = WeightStore(str(tmp_path / "s"))
    store.write_state("stored", stored)
    store.write_state("base", base)
    for base_in in ("memory", "store"):
        base_src = base if base_in == "memory" else store.reader("base")
        got = streamed_merge(
            rule,
            head,
            Decoded(store.reader("stored"), base_src, precision),  # type: ignore[arg-type]
            0.35,
            lambda path=f"v-{base_in}": store.writer(path, specs_of(head)),  # type: ignore[misc]
            # The base the rule reads is the one the result decodes against: read once.
            base=base_src if rule.reads_base else None,
            batch_bytes=batch,
        )
        assert got.applied is not None, got.reason
        assert_bitwise(got.applied.weights, want.weights)
        assert_bitwise(store.read_state(f"v-{base_in}"), want.weights)

"""The batches a streamed merge takes a state in (vcdl.store.streaming.batches): every byte
once, in order, each batch within its limit, a tensor larger than a batch in rows."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from vcdl.store.streaming import Part, TensorSpec, batches, take

shapes = st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple)
specs_lists = st.lists(
    st.tuples(shapes, st.sampled_from([torch.float32, torch.bfloat16, torch.int64])),
    min_size=0,
    max_size=12,
).map(lambda xs: [TensorSpec(f"t{i}", d, s) for i, (s, d) in enumerate(xs)])


@given(specs=specs_lists, limit=st.integers(1, 20_000))
def test_batches_cover_every_tensor_once_in_order_within_the_limit(
    specs: list[TensorSpec], limit: int
) -> None:
    plan = batches(specs, limit)
    # Every tensor in order: whole, or its rows from 0 to the end without gaps.
    flat: list[Part] = [p for batch in plan for p in batch]
    assert [p.name for p in flat if p.whole or p.start == 0] == [s.name for s in specs]
    for s in specs:
        mine = [p for p in flat if p.name == s.name]
        if len(mine) > 1 or not mine[0].whole:
            assert [p.start for p in mine] == [0, *(p.stop for p in mine[:-1])]
            assert mine[-1].stop == s.shape[0]
    for batch in plan:
        assert batch
        if len(batch) > 1 or batch[0].whole:
            assert all(p.whole for p in batch)  # rows of a tensor are a batch alone
        size = sum(_nbytes(p) for p in batch)
        one_row = len(batch) == 1 and not batch[0].whole and batch[0].stop == batch[0].start + 1
        unsplittable = len(batch) == 1 and batch[0].whole and _rows(batch[0].spec) <= 1
        assert size <= limit or one_row or unsplittable


def _rows(s: TensorSpec) -> int:
    return s.shape[0] if len(s.shape) >= 2 else 1


def _nbytes(p: Part) -> int:
    if p.stop is None:
        return p.spec.nbytes
    return (p.stop - p.start) * math.prod(p.spec.shape[1:]) * p.spec.dtype.itemsize


def test_a_part_is_a_view_of_its_rows() -> None:
    t = torch.arange(12.0).reshape(4, 3)
    p = Part(TensorSpec("t", torch.float32, (4, 3)), 1, 3)
    got = take({"t": t}, [p])["t"]
    assert got.data_ptr() == t[1].data_ptr() and got.shape == (2, 3)
    assert take({"t": t}, [Part(p.spec)])["t"] is t

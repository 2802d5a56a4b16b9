"""Tensors compared byte for byte (the merges must equal each other bit for bit)."""

from __future__ import annotations

import torch

from vcdl.types import StateDict


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: NaNs and signed zeros compare as what they are."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bitwise(got: StateDict, want: StateDict) -> None:
    """Same names in the same order, same dtypes and shapes, same bytes."""
    assert list(got) == list(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(bits(got[k]), bits(w)), k

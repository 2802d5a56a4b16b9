"""Results in reduced precision: a worker's change from its base, encoded to fewer bytes.

This module owns the arithmetic of ``merge.result_precision`` (pure
functions, no I/O). A worker's result is most of the bytes that cross the
network per attempt; its *change* from the version it started from is
small beside the weights, so it keeps its meaning in far fewer bits than
the weights themselves would (bf16 weights would lose everything below
2^-8 of each weight; a bf16 change loses 2^-8 of the change).

``full``
    The result as trained (no encoding).
``bf16_delta``
    ``result − base`` of every floating tensor in bfloat16: half the bytes
    of float32. Each element's change keeps 8 bits of mantissa: relative
    error at most 2^-9 of the change (round to nearest).
``int8_delta``
    ``result − base`` quantized per row (the first dimension; a vector or a
    scalar is one row) to int8 with a float32 scale per row, ``scale =
    max|Δ| / 127``, as torchft's quantized collectives do: a quarter of the
    bytes plus one float per row. Absolute error at most ``scale / 2`` per
    element.

Integer and bool tensors (counters, masks) are stored as they are: exact.
The base is the result's base *version* (``attempt.base_version``), which
the driver has; decoding adds the change back to it, computed in float32
and cast to the weights' dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import torch

from vcdl.types import StateDict

Precision = Literal["full", "bf16_delta", "int8_delta"]
PRECISIONS: tuple[Precision, ...] = ("full", "bf16_delta", "int8_delta")

SCALE_SUFFIX = "::scale"
"""An int8 tensor's per-row scales are stored beside it under this suffix."""


def encode(result: StateDict, base: StateDict, precision: Precision) -> StateDict:
    """The tensors to store for ``result`` trained from ``base`` (see the module)."""
    if precision == "full":
        return result
    out: StateDict = {}
    with torch.no_grad():
        for key, r in result.items():
            if not r.is_floating_point():
                out[key] = r
                continue
            delta = r.float() - base[key].float()
            if precision == "bf16_delta":
                out[key] = delta.to(torch.bfloat16)
            else:
                q, scale = quantize_rows(delta)
                out[key] = q
                out[key + SCALE_SUFFIX] = scale
    return out


def decode(stored: Mapping[str, torch.Tensor], base: StateDict, precision: Precision) -> StateDict:
    """The result again: ``base + change`` for floating tensors, in ``base``'s order and dtypes.

    ``stored`` holds at least the tensors :func:`stored_names` gives for the
    keys of ``base``.
    """
    if precision == "full":
        return {k: stored[k] for k in base}
    out: StateDict = {}
    with torch.no_grad():
        for key, b in base.items():
            s = stored[key]
            if not b.is_floating_point():
                out[key] = s
                continue
            if precision == "bf16_delta":
                delta = s.float()
            else:
                delta = dequantize_rows(s, stored[key + SCALE_SUFFIX])
            out[key] = (b.float() + delta).to(b.dtype)
    return out


def stored_names(
    keys: Iterable[str], floating: Mapping[str, bool], precision: Precision
) -> list[str]:
    """The stored tensors that hold ``keys`` (an int8 tensor's scales follow it)."""
    names: list[str] = []
    for k in keys:
        names.append(k)
        if precision == "int8_delta" and floating[k]:
            names.append(k + SCALE_SUFFIX)
    return names


def check_stored(
    stored: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    base: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    precision: Precision,
) -> str | None:
    """Why the stored tensors (dtype, shape by name) cannot encode a result of ``base``'s model.

    One line for the ledger, or None. Metadata only: a result that claims
    an encoding must hold exactly the tensors that encoding stores.
    """
    want: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for key, (dtype, shape) in base.items():
        if not dtype.is_floating_point or precision == "full":
            want[key] = (dtype, shape)
        elif precision == "bf16_delta":
            want[key] = (torch.bfloat16, shape)
        else:
            want[key] = (torch.int8, shape)
            want[key + SCALE_SUFFIX] = (torch.float32, (_row_count(shape),))
    if set(stored) != set(want):
        missing = sorted(set(want) - set(stored))[:3]
        extra = sorted(set(stored) - set(want))[:3]
        return (
            f"the result is not a {precision} encoding of this model's state "
            f"(missing {missing}, extra {extra})"
        )
    for key, (dtype, shape) in want.items():
        got = stored[key]
        if got[0] != dtype or tuple(got[1]) != shape:
            return (
                f"{precision} result: {key!r} is {got[0]} {list(got[1])}, "
                f"expected {dtype} {list(shape)}"
            )
    return None


def _row_count(shape: tuple[int, ...]) -> int:
    return shape[0] if len(shape) >= 2 else 1


def quantize_rows(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values of ``delta``'s shape and a float32 scale per row (``max|row| / 127``)."""
    rows = _rows(delta)
    if rows.numel() == 0:
        return torch.zeros(delta.shape, dtype=torch.int8), torch.ones(rows.shape[0])
    scale = rows.abs().amax(dim=1) / 127.0
    # A row of zeros (or an empty one) keeps scale 1: q = 0 decodes to 0.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(delta.shape), scale.float()


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The change :func:`quantize_rows` encoded, in float32."""
    rows = _rows(q).float() * scale[:, None]
    return rows.reshape(q.shape)


def _rows(t: torch.Tensor) -> torch.Tensor:
    n = _row_count(tuple(t.shape))
    return t.reshape(n, t.numel() // n if n else 0)


def stored_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of the tensors a result stores."""
    return sum(t.numel() * t.element_size() for t in state.values())

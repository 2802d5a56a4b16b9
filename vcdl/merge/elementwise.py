"""The elementwise building blocks every merge rule shares. No I/O.

Dtype handling (narrow floats computed in float32), the unit-interval check
of α-like arguments, the max/or of integer and bool tensors, the two blends
(mul+add and screened lerp) and the checks of caller-given output buffers.
:mod:`vcdl.merge.ops` and :mod:`vcdl.merge.delta` build their rules from
these.
"""

from __future__ import annotations

import math

import torch

from vcdl.errors import MergeError
from vcdl.merge.checks import (
    mismatch,
)
from vcdl.types import StateDict


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Narrow floats lose too much precision when every intermediate product
    # is rounded back to 8-11 bits of mantissa; float32 is exact enough and
    # what torch's own reduced-precision kernels use internally.
    return torch.float32 if dtype.itemsize < 4 else dtype


def unit_interval(name: str, value: float) -> float:
    """``value`` as a float in [0, 1], else MergeError."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise MergeError(f"{name} must be a number in [0, 1], got {value!r}") from None
    # NaN fails both comparisons, so this also rejects NaN and ±inf.
    if not 0.0 <= v <= 1.0:
        raise MergeError(f"{name} must be a finite number in [0, 1], got {value!r}")
    return v


def int_or_bool(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    # Counters (num_batches_tracked) must never go backwards: max. Flags: or.
    if a.dtype == torch.bool:
        return torch.logical_or(a, b) if out is None else torch.logical_or(a, b, out=out)
    return torch.maximum(a, b) if out is None else torch.maximum(a, b, out=out)


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if ``a`` and ``b`` live in one storage (so writing ``a`` could change ``b``)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def output_problem(out: StateDict, head: StateDict, *inputs: StateDict) -> str | None:
    """Why ``out`` cannot receive a merge of ``head`` with ``inputs``, or None if it can.

    ``out`` must hold tensors with ``head``'s keys, shapes, dtypes and devices
    that share no memory with ``head`` or any input (writing them must not
    change an input). Checks metadata and storage pointers only.
    """
    reason = mismatch(head, out, "out")
    if reason is not None:
        return reason
    for key, o in out.items():
        for state in (head, *inputs):
            t = state.get(key)
            if isinstance(t, torch.Tensor) and same_memory(o, t):
                return f"out[{key!r}] shares memory with an input; pass buffers of their own"
    return None


def require_output(out: StateDict | None, head: StateDict, *inputs: StateDict) -> None:
    """Raise MergeError if ``out`` is given and cannot hold the merge (:func:`output_problem`)."""
    if out is not None:
        problem = output_problem(out, head, *inputs)
        if problem is not None:
            raise MergeError(problem)


def blend(
    head: torch.Tensor,
    result: torch.Tensor,
    alpha: float,
    beta: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``head*alpha + result*beta`` in head's dtype, as a new tensor or into ``out``."""
    # A product then an in-place add: one pass each while the tensor is in
    # cache, and with alpha=1 it is head*1 + result*0 == head bit for bit (up
    # to the sign of zero), with alpha=0 result. torch.lerp is also exact at
    # both ends and one pass, but measured within noise (5-15%) of this on a
    # ResNet-50 state and its (head - result) can overflow where this cannot.
    if head.dtype.itemsize < 4:
        acc = head.to(torch.float32)  # a copy, so the in-place ops below are safe
        acc.mul_(alpha).add_(result, alpha=beta)
        return acc.to(head.dtype) if out is None else out.copy_(acc)
    if out is None:
        return torch.mul(head, alpha).add_(result, alpha=beta)
    return torch.mul(head, alpha, out=out).add_(result, alpha=beta)


def lerp_screened(
    head: torch.Tensor,
    result: torch.Tensor,
    alpha: float,
    beta: float,
    out: torch.Tensor | None,
) -> tuple[torch.Tensor, bool]:
    """``alpha * head + beta * result`` by lerp in head's dtype, and whether it is finite."""
    # lerp takes its weight in the tensor's precision: a weight near 1 would
    # leave 1 - weight with a large relative error (beta 0.999 in float32:
    # 1.3e-5), so always step from the nearer end by a weight <= 0.5, given
    # as alpha or beta themselves (1 - beta can round alpha away). Both ends
    # stay exact: lerp(a, b, 0) == a.
    start, end, weight = (head, result, beta) if beta <= 0.5 else (result, head, alpha)
    if head.dtype.itemsize < 4:
        acc = torch.lerp(start.to(torch.float32), end.to(torch.float32), weight)
        finite = math.isfinite(float(torch.linalg.vector_norm(acc)))
        return (acc.to(head.dtype) if out is None else out.copy_(acc)), finite
    t = (
        torch.lerp(start, end, weight, out=out)
        if out is not None
        else torch.lerp(start, end, weight)
    )
    # A reduction with no temporary; a non-finite norm is the cheap signal
    # (squares past the dtype's range also trip it; the slow path sorts it out).
    return t, math.isfinite(float(torch.linalg.vector_norm(t)))

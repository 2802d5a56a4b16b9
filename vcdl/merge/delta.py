"""The delta merge rule: each result's own change, applied to the head.

This module owns one merge rule beside VC-ASGD (docs/design.md §1, "other merge
rules are welcome"), as pure functions of state dicts::

    W_{v+1} = W_v + (1 − α) · (W_c − W_b)

where ``W_b`` is the version the attempt started from (its *base*). VC-ASGD
blends the head with the result's *weights*, so a result trained from an
older version pulls the head back towards that version: with two workers
nearly every result is one version stale, and each merge undoes part of
the other worker's last contribution. The delta rule adds only what the
attempt learned. With α = 0.5 and two results from one base it is their
plain average (local SGD); with α = 0 and no staleness it is sequential
training. It is the asynchronous model-averaging update of e.g. Zhang et
al., "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016,
https://arxiv.org/abs/1511.05950, applied to a whole attempt's change
rather than to one gradient. At α = 0 the sum of several stale changes can
overshoot (measured: unstable with two workers); the run's α schedule and
staleness policy apply as for VC-ASGD.

Conventions are :mod:`vcdl.merge`'s: floats narrower than 32 bits are
computed in float32 and cast back once; integer tensors take the max and
bool tensors the or (of head and result); inputs are never mutated; ``out``
may receive the new values.
"""

from __future__ import annotations

import math

import torch

from vcdl.merge.checks import mismatch, nonfinite, require_compatible, validate_result
from vcdl.merge.elementwise import compute_dtype, int_or_bool, require_output, unit_interval
from vcdl.types import StateDict

__all__ = ["delta", "validated_delta"]


def _delta_tensor(
    head: torch.Tensor,
    result: torch.Tensor,
    base: torch.Tensor,
    beta: float,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """``head + beta * (result - base)`` in head's dtype, as a new tensor or into ``out``."""
    cdt = compute_dtype(head.dtype)
    if cdt != head.dtype:
        acc = torch.sub(result.to(cdt), base.to(cdt)).mul_(beta).add_(head.to(cdt))
        return acc.to(head.dtype) if out is None else out.copy_(acc)
    # The difference first, then scaled and added in place: two passes, no
    # temporary beyond the output. With beta 0 it is head + 0 == head (for a
    # finite change), bit for bit up to the sign of zero.
    acc = torch.sub(result, base) if out is None else torch.sub(result, base, out=out)
    return acc.mul_(beta).add_(head)


def delta(
    head: StateDict,
    result: StateDict,
    base: StateDict,
    alpha: float,
    out: StateDict | None = None,
) -> StateDict:
    """``head + (1 - alpha) * (result - base)``: the result's change from its base.

    ``alpha`` keeps the meaning it has in VC-ASGD (the head's weight), so
    ``alpha=1`` returns the head; ``alpha=0`` adds the whole change. When
    ``base`` is ``head`` this is :func:`vcdl.merge.vc_asgd` up to rounding.

    Raises:
        MergeError: alpha not finite or outside [0, 1]; ``result`` or
            ``base`` do not match ``head`` (the message names the key);
            ``out`` does not fit or overlaps an input.
    """
    a = unit_interval("alpha", alpha)
    require_compatible(head, result, "result")
    require_compatible(head, base, "base")
    require_output(out, head, result, base)
    beta = 1.0 - a
    new: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            o = None if out is None else out[key]
            if h.is_floating_point():
                new[key] = _delta_tensor(h, result[key], base[key], beta, o)
            else:
                new[key] = int_or_bool(h, result[key], o)
    return new


def validated_delta(
    head: StateDict,
    result: StateDict,
    base: StateDict,
    alpha: float,
    max_update_norm: float | None = None,
    out: StateDict | None = None,
) -> StateDict | str:
    """:func:`vcdl.merge.validate_result` (against ``base``) fused with :func:`delta`.

    Returns the merged state or the reason not to merge: the result does not
    match the head, holds NaN/Inf, or lies farther than ``max_update_norm``
    (L2) from its own base. Without a bound the NaN/Inf pass over the result
    is replaced by a norm of each output tensor while it is in cache; a
    non-finite output is then traced to the result (rejected) or to the head
    or the base (merged as computed, as VC-ASGD propagates a head's NaN).

    Raises:
        MergeError: alpha or max_update_norm out of range; ``base`` does not
            match ``head``; ``out`` does not fit. A bad result is a returned
            reason, never an exception.
    """
    a = unit_interval("alpha", alpha)
    reason = mismatch(head, result, "result")
    if reason is not None:
        return reason
    require_compatible(head, base, "base")
    require_output(out, head, result, base)
    if max_update_norm is not None:
        reason = validate_result(base, result, max_update_norm)
        if reason is not None:
            return reason
    beta = 1.0 - a
    new: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            o = None if out is None else out[key]
            if not h.is_floating_point():
                new[key] = int_or_bool(h, r, o)
                continue
            t = _delta_tensor(h, r, base[key], beta, o)
            if not math.isfinite(float(torch.linalg.vector_norm(t))):
                bad = nonfinite(r, f"result[{key!r}]")
                if bad is not None:
                    return bad
            new[key] = t
    return new

"""Merge rules: pure functions from state dicts to state dicts.

This module owns the arithmetic of turning a worker's result into the next
global version, and nothing else (no I/O, no ledger, no store):

* :func:`vc_asgd` — the VC-ASGD assimilation rule
  ``W_{v+1} = α·W_v + (1 − α)·W_c`` (DESIGN.md §1). Kijsipongse, Piyatumrong,
  U-ruekolan, "A hybrid GPU cluster and volunteer computing platform for
  scalable deep learning", J. Supercomputing 74(7):3236–3263, 2018,
  https://doi.org/10.1007/s11227-018-2375-9.
* :func:`average` — weighted mean of several states (synchronous baseline,
  local SGD / model averaging).
* :func:`easgd` — the center update of Elastic Averaging SGD: Zhang,
  Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NeurIPS
  2015, https://arxiv.org/abs/1412.6651.
* :func:`diloco` — the DiLoCo outer step: the pseudo-gradient ``W_v − W_c``
  fed to an outer Nesterov SGD whose momentum buffer is a state dict like the
  weights. Douillard et al., "DiLoCo: Distributed Low-Communication Training
  of Language Models", 2023, https://arxiv.org/abs/2311.08105.
* :func:`scale_result` — shrink a partial result (a preempted attempt that
  processed a fraction of its shard) towards the head.
* :func:`staleness_alpha` — the staleness policies of DESIGN.md §1.
* :func:`validate_result`, :func:`state_norm`, :func:`update_norm` — the
  checks that keep NaN/Inf, foreign architectures and absurd updates out of
  the chain of versions.

Conventions shared by every rule:

* Floating tensors follow the rule's arithmetic. float16, bfloat16 (and any
  other float narrower than 32 bits) are computed in float32 and cast back,
  so rounding happens once, not at every intermediate step.
* Integer tensors (BatchNorm ``num_batches_tracked``) take the elementwise
  max: a counter must never go backwards or become a fraction. Bool tensors
  take the logical or. Other dtypes (complex, quantized) are rejected.
* Outputs are new tensors in the head's key order, dtype, shape and device;
  inputs are never mutated and never aliased by the output, so a caller may
  modify the returned state freely.
* Everything runs under ``torch.no_grad()``: a state may hold parameters
  that require grad, and merging must not build an autograd graph.
* Mismatched inputs raise :class:`~vcdl.errors.MergeError` naming the key.

Performance: the rules are memory-bound elementwise passes, one or two torch
ops per tensor (no Python per-element work, no intermediate copies for
float32/float64). On one thread :func:`vc_asgd` on a ResNet-50 state (320
tensors, 25.6M floats) runs at about the speed of the same blend on one
preallocated 25.6M-element tensor. Torch intra-op threads buy little for such
passes and each op above the parallel grain opens an OpenMP region, so on a
CPU shared with other processes a merge with several threads can be 10-20x
slower than with one (measured): call the merge rules from a process or
thread that runs with ``torch.set_num_threads(1)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from vcdl.errors import MergeError
from vcdl.types import StateDict

__all__ = [
    "STALENESS_POLICIES",
    "average",
    "diloco",
    "easgd",
    "scale_result",
    "staleness_alpha",
    "state_norm",
    "update_norm",
    "validate_result",
    "vc_asgd",
]

STALENESS_POLICIES: tuple[str, ...] = ("plain", "raise", "reject")
"""Names accepted by :func:`staleness_alpha`."""

# Integer dtypes whose elementwise max torch implements on every backend.
_INT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})

# How many missing/extra keys a key-set error lists before "(+N more)".
_MAX_KEYS_LISTED = 5

_Kind = Literal["float", "int", "bool"]


# --------------------------------------------------------------------------
# Helpers: dtype classes, argument checks, compatibility checks
# --------------------------------------------------------------------------


def _kind(dtype: torch.dtype) -> _Kind | None:
    if dtype.is_floating_point:
        return "float"
    if dtype == torch.bool:
        return "bool"
    if dtype in _INT_DTYPES:
        return "int"
    return None


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Narrow floats lose too much precision when every intermediate product
    # is rounded back to 8-11 bits of mantissa; float32 is exact enough and
    # what torch's own reduced-precision kernels use internally.
    return torch.float32 if dtype.itemsize < 4 else dtype


def _unit(name: str, value: float) -> float:
    """``value`` as a float in [0, 1], else MergeError."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise MergeError(f"{name} must be a number in [0, 1], got {value!r}") from None
    # NaN fails both comparisons, so this also rejects NaN and ±inf.
    if not 0.0 <= v <= 1.0:
        raise MergeError(f"{name} must be a finite number in [0, 1], got {value!r}")
    return v


def _fmt_keys(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_MAX_KEYS_LISTED])
    more = len(keys) - _MAX_KEYS_LISTED
    return f"[{shown}]" + (f" (+{more} more)" if more > 0 else "")


def _mismatch(head: Mapping[str, object], other: Mapping[str, object], name: str) -> str | None:
    """One-line reason why ``other`` cannot be merged into ``head``, or None.

    Checks key sets, tensor types, shapes, dtypes, devices and that the
    dtype is one a merge rule knows; never touches tensor data, so it costs
    microseconds even for large models.
    """
    if head.keys() != other.keys():
        missing = [k for k in head if k not in other]
        extra = [k for k in other if k not in head]
        parts = []
        if missing:
            parts.append(f"missing from {name}: {_fmt_keys(missing)}")
        if extra:
            parts.append(f"extra in {name}: {_fmt_keys(extra)}")
        return f"key sets differ ({'; '.join(parts)}); {name} is not a state of this model"
    for key, h in head.items():
        o = other[key]
        if not isinstance(h, torch.Tensor):
            return f"head[{key!r}] is a {type(h).__name__}, not a torch.Tensor"
        if not isinstance(o, torch.Tensor):
            return f"{name}[{key!r}] is a {type(o).__name__}, not a torch.Tensor"
        if o.shape != h.shape:
            return (
                f"shape mismatch at {key!r}: head {tuple(h.shape)}, {name} {tuple(o.shape)}; "
                "not the same architecture"
            )
        if o.dtype != h.dtype:
            return (
                f"dtype mismatch at {key!r}: head {h.dtype}, {name} {o.dtype}; "
                "cast the state to the model's dtypes before merging"
            )
        if o.device != h.device:
            return (
                f"device mismatch at {key!r}: head on {h.device}, {name} on {o.device}; "
                "move both states to one device before merging"
            )
        if _kind(h.dtype) is None:
            return (
                f"unsupported dtype {h.dtype} at {key!r}: merge rules handle floating, "
                "integer and bool tensors"
            )
    return None


def _require_compatible(head: StateDict, other: StateDict, name: str) -> None:
    reason = _mismatch(head, other, name)
    if reason is not None:
        raise MergeError(reason)


def _int_or_bool(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Counters (num_batches_tracked) must never go backwards: max. Flags: or.
    if a.dtype == torch.bool:
        return torch.logical_or(a, b)
    return torch.maximum(a, b)


def _norm(t: torch.Tensor) -> float:
    """L2 norm of a floating tensor, accumulated in at least float32."""
    # vector_norm is a single reduction pass with no temporary (about 30 GB/s
    # on one core here, vs 0.6 GB/s for isfinite(t).all()), so it doubles as
    # the fast NaN/Inf screen in validate_result.
    if t.dtype.itemsize < 4:
        return float(torch.linalg.vector_norm(t, dtype=torch.float32))
    return float(torch.linalg.vector_norm(t))


def _diff_norm(head: torch.Tensor, result: torch.Tensor) -> float:
    """L2 norm of ``result - head`` (floating tensors of equal dtype)."""
    if head.dtype.itemsize < 4:
        d = result.to(torch.float32)
        d.sub_(head)  # mixed-dtype in-place sub promotes head to float32 on the fly
    else:
        d = torch.sub(result, head)
    return float(torch.linalg.vector_norm(d))


def _nonfinite(t: torch.Tensor, label: str) -> str | None:
    """Reason naming ``label`` if ``t`` holds NaN or Inf. Slow path, failures only."""
    n_nan = int(torch.isnan(t).sum())
    n_inf = int(torch.isinf(t).sum())
    if n_nan or n_inf:
        return f"{label} contains {n_nan} NaN and {n_inf} Inf values (of {t.numel()})"
    return None


# --------------------------------------------------------------------------
# Merge rules
# --------------------------------------------------------------------------


def _blend(head: torch.Tensor, result: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """``head*alpha + result*beta`` as a new tensor of head's dtype."""
    # A product then an in-place add: one allocation (the output itself), and
    # with alpha=1 it is head*1 + result*0 == head bit for bit (up to the sign
    # of zero), with alpha=0 result. torch.lerp is also exact at both ends and
    # is one pass, but measured within noise (5-10%) of this on a ResNet-50
    # state (each tensor stays in cache between the two passes), and its
    # (head - result) can overflow where this form cannot.
    if head.dtype.itemsize < 4:
        acc = head.to(torch.float32)  # a copy, so the in-place ops below are safe
        acc.mul_(alpha).add_(result, alpha=beta)
        return acc.to(head.dtype)
    return torch.mul(head, alpha).add_(result, alpha=beta)


def vc_asgd(head: StateDict, result: StateDict, alpha: float) -> StateDict:
    """VC-ASGD assimilation: ``alpha * head + (1 - alpha) * result``.

    ``alpha`` is the weight of the current head (``α_e`` of DESIGN.md §1), so
    ``alpha=1`` ignores the result and ``alpha=0`` replaces the head by it;
    both ends are exact for finite inputs. Integer tensors take the
    elementwise max, bool tensors the logical or.

    Raises:
        MergeError: alpha not finite or outside [0, 1]; key sets, shapes,
            dtypes or devices differ (the message names the key).
    """
    a = _unit("alpha", alpha)
    _require_compatible(head, result, "result")
    beta = 1.0 - a
    out: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            out[key] = _blend(h, r, a, beta) if h.is_floating_point() else _int_or_bool(h, r)
    return out


def average(states: Sequence[StateDict], weights: Sequence[float] | None = None) -> StateDict:
    """Weighted mean of ``states`` (equal weights by default).

    Weights need not sum to one (they are normalized) but must be finite,
    non-negative and have a positive sum; states with weight zero still have
    to match the others. Integer tensors take the max over all states, bool
    tensors the or.

    The mean is accumulated as a running weighted mean,
    ``m ← m + (w_i / Σw) · (x_i − m)`` via ``lerp_``: one in-place pass per
    state, and exact when the states agree (averaging identical states
    returns that state bit for bit, which a sum of products would not). The
    price: the rounding error is a few ulps of the largest input rather than
    of the weighted terms, so a state whose weight is below ~1e-16 of the
    total is absorbed; with shard-sized weights this never matters.

    Raises:
        MergeError: no states; bad weights; states that do not match
            ``states[0]`` (the message names the state and the key).
    """
    if len(states) == 0:
        raise MergeError("average() needs at least one state, got none")
    w = _check_weights(weights, len(states))
    first = states[0]
    for i, s in enumerate(states[1:], start=1):
        _require_compatible(first, s, f"states[{i}]")
    # Zero-weight states cannot change the float mean; skipping them also
    # keeps the first contributing state's weight positive for the division.
    used = [(s, wi) for s, wi in zip(states, w, strict=True) if wi > 0.0]
    out: StateDict = {}
    with torch.no_grad():
        for key, h in first.items():
            if not h.is_floating_point():
                acc_i = h
                for s in states[1:]:
                    acc_i = _int_or_bool(acc_i, s[key])  # a fresh tensor each time
                out[key] = h.clone() if acc_i is h else acc_i
                continue
            cdt = _compute_dtype(h.dtype)
            acc = used[0][0][key].to(cdt, copy=True)
            total = used[0][1]
            for s, wi in used[1:]:
                total += wi
                # lerp_ needs equal dtypes; the upcast copy only happens for
                # float16/bfloat16.
                acc.lerp_(s[key].to(cdt), wi / total)
            out[key] = acc if acc.dtype == h.dtype else acc.to(h.dtype)
    return out


def _check_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    if len(weights) != n:
        raise MergeError(f"got {len(weights)} weights for {n} states; give one weight per state")
    try:
        w = [float(x) for x in weights]
    except (TypeError, ValueError):
        raise MergeError(f"weights must be numbers, got {list(weights)!r}") from None
    for i, x in enumerate(w):
        if not (math.isfinite(x) and x >= 0.0):
            raise MergeError(f"weights must be finite and >= 0, got weights[{i}] = {x!r}")
    if not sum(w) > 0.0:
        raise MergeError(f"weights must have a positive sum, got {w!r}")
    return w


def easgd(head: StateDict, result: StateDict, rho: float) -> StateDict:
    """EASGD center update ``head + rho * (result - head)``, ``rho`` in [0, 1].

    In Zhang et al. the center variable moves towards each worker by the
    elastic step ``β = ηρ`` (here ``rho``); algebraically that is
    :func:`vc_asgd` with ``alpha = 1 - rho``, which this delegates to (so the
    two rules round identically and share their validation).
    """
    r = _unit("rho", rho)
    return vc_asgd(head, result, 1.0 - r)


def diloco(
    head: StateDict,
    result: StateDict,
    momentum_buf: StateDict | None,
    lr: float = 0.7,
    momentum: float = 0.9,
    nesterov: bool = True,
) -> tuple[StateDict, StateDict]:
    """DiLoCo outer step with SGD (Nesterov by default) on the pseudo-gradient.

    For each floating tensor::

        g    = head - result
        buf  = momentum * buf + g          (buf = 0 when momentum_buf is None)
        step = g + momentum * buf  if nesterov else  buf
        new  = head - lr * step

    Integer tensors take the max and bool tensors the or, as in
    :func:`vc_asgd`. The defaults (lr 0.7, momentum 0.9, Nesterov) are the
    paper's. With ``lr=1, momentum=0`` the step returns ``result``.

    Returns:
        ``(new_state, new_buf)``. ``new_buf`` holds the floating keys only,
        in float32 for float16/bfloat16 parameters (momentum accumulates many
        small steps and would stall in 8-11 bits of mantissa), else in the
        parameter's dtype. Store it like weights and pass it back next time.

    Raises:
        MergeError: mismatched states, a buffer whose keys or shapes do not
            match the floating tensors of ``head``, ``lr`` not finite and
            >= 0, ``momentum`` outside [0, 1).
    """
    lr_f = float(lr)
    if not (math.isfinite(lr_f) and lr_f >= 0.0):
        raise MergeError(f"lr must be finite and >= 0, got {lr!r}")
    mu = float(momentum)
    if not 0.0 <= mu < 1.0:
        raise MergeError(f"momentum must be in [0, 1), got {momentum!r}")
    _require_compatible(head, result, "result")
    float_keys = [k for k, t in head.items() if t.is_floating_point()]
    if momentum_buf is not None:
        _check_buffer(head, float_keys, momentum_buf)

    new: StateDict = {}
    new_buf: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            if not h.is_floating_point():
                new[key] = _int_or_bool(h, r)
                continue
            cdt = _compute_dtype(h.dtype)
            h_c = h.to(cdt)  # may alias h: only read below
            g = torch.sub(h_c, r.to(cdt))  # a fresh tensor
            # No buffer: mu * 0 + g is g itself (aliasing is safe, g is never
            # modified below). Otherwise a fresh tensor: the caller's buffer
            # is not mutated.
            buf = g if momentum_buf is None else torch.add(g, momentum_buf[key].to(cdt), alpha=mu)
            step = torch.add(g, buf, alpha=mu) if nesterov else buf
            new[key] = torch.add(h_c, step, alpha=-lr_f).to(h.dtype)
            new_buf[key] = buf
    return new, new_buf


def _check_buffer(head: StateDict, float_keys: list[str], buf: StateDict) -> None:
    if set(buf.keys()) != set(float_keys):
        missing = [k for k in float_keys if k not in buf]
        extra = [k for k in buf if k not in head or not head[k].is_floating_point()]
        raise MergeError(
            "momentum_buf must hold exactly the floating keys of head "
            f"(missing: {_fmt_keys(missing)}; extra: {_fmt_keys(extra)}); "
            "pass None to start from zeros"
        )
    for key in float_keys:
        b, h = buf[key], head[key]
        if not isinstance(b, torch.Tensor) or not b.is_floating_point():
            raise MergeError(f"momentum_buf[{key!r}] must be a floating tensor")
        if b.shape != h.shape:
            raise MergeError(
                f"shape mismatch at {key!r}: head {tuple(h.shape)}, momentum_buf {tuple(b.shape)}"
            )
        if b.device != h.device:
            raise MergeError(
                f"device mismatch at {key!r}: head {h.device}, momentum_buf {b.device}"
            )


def scale_result(head: StateDict, result: StateDict, fraction: float) -> StateDict:
    """Shrink a partial result towards the head: ``head + f * (result - head)``.

    A preempted attempt that processed a fraction ``f`` of its shard moved
    the weights only part of the way; merging the scaled result moves the
    head proportionally less. ``f=0`` returns head, ``f=1`` returns result,
    both exactly (``torch.lerp`` switches formula at 0.5 to keep both ends
    exact). Integer and bool tensors are taken from the result (copied).

    Raises:
        MergeError: fraction not finite or outside [0, 1]; mismatched states.
    """
    f = _unit("fraction", fraction)
    _require_compatible(head, result, "result")
    out: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            if not h.is_floating_point():
                out[key] = r.clone()
                continue
            cdt = _compute_dtype(h.dtype)
            out[key] = torch.lerp(h.to(cdt), r.to(cdt), f).to(h.dtype)
    return out


def staleness_alpha(
    alpha: float,
    staleness: int,
    policy: str = "plain",
    power: float = 1.0,
    max_staleness: int | None = None,
) -> float | None:
    """Effective α for a result of staleness ``s = v − v_b`` (DESIGN.md §1).

    * ``"plain"``: ``alpha`` whatever ``s`` (``max_staleness`` is ignored).
    * ``"raise"``: ``α_eff = 1 − (1 − α)/(1 + s)^power``, so a stale result
      moves the head less; equals ``alpha`` at ``s=0``, non-decreasing in
      ``s``, within ``[alpha, 1]``.
    * ``"reject"``: ``alpha``, unless ``max_staleness`` is set and
      ``s > max_staleness``.

    ``"raise"`` also rejects past ``max_staleness`` when it is set.

    Returns:
        The effective α, or None when the result must be rejected.

    Raises:
        MergeError: unknown policy (lists the allowed ones), negative
            staleness or max_staleness, alpha outside [0, 1], power not
            finite and >= 0.
    """
    a = _unit("alpha", alpha)
    if policy not in STALENESS_POLICIES:
        raise MergeError(
            f"unknown staleness policy {policy!r}; allowed: {', '.join(STALENESS_POLICIES)}"
        )
    try:
        s = int(staleness)
    except (TypeError, ValueError):
        raise MergeError(f"staleness must be an integer >= 0, got {staleness!r}") from None
    if s != staleness or s < 0:
        raise MergeError(f"staleness must be an integer >= 0, got {staleness!r}")
    p = float(power)
    if not (math.isfinite(p) and p >= 0.0):
        raise MergeError(f"power must be finite and >= 0, got {power!r}")
    if max_staleness is not None and max_staleness < 0:
        raise MergeError(f"max_staleness must be >= 0 or None, got {max_staleness!r}")

    if policy == "plain":
        return a
    if max_staleness is not None and s > max_staleness:
        return None
    if policy == "reject" or s == 0:
        # s == 0 short-circuits because 1 - (1 - a) need not round back to a.
        return a
    eff = 1.0 - (1.0 - a) / (1.0 + s) ** p
    # Clamp to [a, 1]: the same rounding can leave eff an ulp below a for a
    # tiny power; the clamp keeps the documented bounds and monotonicity.
    return min(1.0, max(a, eff))


# --------------------------------------------------------------------------
# Checks and norms
# --------------------------------------------------------------------------


def validate_result(
    head: StateDict, result: StateDict, max_update_norm: float | None = None
) -> str | None:
    """Why ``result`` must not be merged into ``head``, or None if it may.

    Rejects wrong/missing/extra keys, non-tensors, shape, dtype or device
    mismatches, unsupported dtypes, NaN or Inf in a floating tensor, and
    (when ``max_update_norm`` is given) a global L2 norm of
    ``result − head`` over floating tensors above ``max_update_norm``.
    The reason is one line, names the offending key and gives the numbers,
    ready for the ledger.

    Never raises for a bad result; raises MergeError only for a bad
    ``max_update_norm`` (NaN or negative), which is a caller bug.
    """
    bound: float | None = None
    if max_update_norm is not None:
        bound = float(max_update_norm)
        if not bound >= 0.0:  # also rejects NaN
            raise MergeError(f"max_update_norm must be >= 0 or None, got {max_update_norm!r}")
    reason = _mismatch(head, result, "result")
    if reason is not None:
        return reason
    sq = 0.0
    with torch.no_grad():
        for key, h in head.items():
            if not h.is_floating_point():
                continue
            r = result[key]
            # One reduction per tensor; a non-finite norm is the cheap signal
            # that sends us to the slow, exact NaN/Inf count.
            n = _norm(r) if bound is None else _diff_norm(h, r)
            if math.isfinite(n):
                sq += n * n
                continue
            bad = _nonfinite(r, f"result[{key!r}]")
            if bad is None and bound is not None:
                bad = _nonfinite(h, f"head[{key!r}]")
            if bad is not None:
                return bad
            # All values finite but the squares overflowed float32/float64.
            if bound is not None:
                return (
                    f"update norm overflows at {key!r} (values around 1e19 or more); "
                    f"exceeds max_update_norm {bound:.6g}"
                )
    if bound is not None:
        total = math.sqrt(sq)
        if total > bound:
            return f"update norm {total:.6g} exceeds max_update_norm {bound:.6g}"
    return None


def state_norm(state: StateDict) -> float:
    """Global L2 norm over the floating tensors of ``state``."""
    with torch.no_grad():
        sq = sum(_norm(t) ** 2 for t in state.values() if t.is_floating_point())
    return math.sqrt(sq)


def update_norm(head: StateDict, result: StateDict) -> float:
    """Global L2 norm of ``result − head`` over floating tensors.

    Raises:
        MergeError: mismatched states (the message names the key).
    """
    _require_compatible(head, result, "result")
    with torch.no_grad():
        sq = sum(_diff_norm(h, result[k]) ** 2 for k, h in head.items() if h.is_floating_point())
    return math.sqrt(sq)

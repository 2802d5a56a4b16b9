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
  the chain of versions (defined in :mod:`vcdl.merge_checks`, re-exported).

Conventions shared by every rule:

* Floating tensors follow the rule's arithmetic. float16, bfloat16 (and any
  other float narrower than 32 bits) are computed in float32 and cast back,
  so rounding happens once, not at every intermediate step.
* Integer tensors (BatchNorm ``num_batches_tracked``) take the elementwise
  max: a counter must never go backwards or become a fraction. Bool tensors
  take the logical or. Other dtypes (complex, quantized) are rejected.
* Outputs are new tensors in the head's key order, dtype, shape and device;
  inputs are never mutated and never aliased by the output, so a caller may
  modify the returned state freely. :func:`vc_asgd` (the assimilator's hot
  path) can instead write into caller-given buffers (``out=``), which must
  not overlap the inputs; the inputs stay unchanged either way.
* Everything runs under ``torch.no_grad()``: a state may hold parameters
  that require grad, and merging must not build an autograd graph.
* Mismatched inputs raise :class:`~vcdl.errors.MergeError` naming the key.

Performance: the rules are memory-bound elementwise passes, one or two torch
ops per tensor (no Python per-element work, no intermediate copies for
float32/float64). Measured on one thread, ResNet-50 state (320 tensors,
25.6M floats), on a 2-core machine shared with other jobs (medians, noisy): a
blend into a fresh flat 98 MiB output was 3x slower than into a
preallocated one (page faults); ``validate_result`` + :func:`vc_asgd` into
fresh tensors, the assimilator's old path, ran at 24-32% of a preallocated
blend; :func:`validated_vc_asgd` into reused buffers (``out=``, what the
assimilator now does) at 54-80% of the fastest preallocated blend
(``torch.lerp``), see ``benchmarks/weights_io.py``. Torch intra-op threads
buy little for such passes and each op above the parallel grain opens an
OpenMP region, so on a CPU shared with other processes a merge with several
threads can be 10-20x slower than with one (measured): call the merge rules
from a process or thread that runs with ``torch.set_num_threads(1)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vcdl.errors import MergeError
from vcdl.merge_checks import (
    fmt_keys,
    mismatch,
    nonfinite,
    require_compatible,
    state_norm,
    update_norm,
    validate_result,
)
from vcdl.types import StateDict

__all__ = [
    "STALENESS_POLICIES",
    "average",
    "diloco",
    "easgd",
    "output_problem",
    "scale_result",
    "staleness_alpha",
    "state_norm",
    "update_norm",
    "validate_result",
    "validated_vc_asgd",
    "vc_asgd",
]

STALENESS_POLICIES: tuple[str, ...] = ("plain", "raise", "reject")
"""Names accepted by :func:`staleness_alpha`."""


# --------------------------------------------------------------------------
# Helpers: dtype classes, argument checks, output buffers
# --------------------------------------------------------------------------


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


def _int_or_bool(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    # Counters (num_batches_tracked) must never go backwards: max. Flags: or.
    if a.dtype == torch.bool:
        return torch.logical_or(a, b) if out is None else torch.logical_or(a, b, out=out)
    return torch.maximum(a, b) if out is None else torch.maximum(a, b, out=out)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
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
            if isinstance(t, torch.Tensor) and _same_memory(o, t):
                return f"out[{key!r}] shares memory with an input; pass buffers of their own"
    return None


def _require_output(out: StateDict | None, head: StateDict, *inputs: StateDict) -> None:
    """Raise MergeError if ``out`` is given and cannot hold the merge (:func:`output_problem`)."""
    if out is not None:
        problem = output_problem(out, head, *inputs)
        if problem is not None:
            raise MergeError(problem)


# --------------------------------------------------------------------------
# Merge rules
# --------------------------------------------------------------------------


def _blend(
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


def vc_asgd(
    head: StateDict, result: StateDict, alpha: float, out: StateDict | None = None
) -> StateDict:
    """VC-ASGD assimilation: ``alpha * head + (1 - alpha) * result``.

    ``alpha`` is the weight of the current head (``α_e`` of DESIGN.md §1), so
    ``alpha=1`` ignores the result and ``alpha=0`` replaces the head by it;
    both ends are exact for finite inputs. Integer tensors take the
    elementwise max, bool tensors the logical or.

    ``out``, if given, receives the new values (its tensors are overwritten
    and returned, in head's key order): a caller that merges repeatedly
    passes the buffers of a state it no longer needs and saves allocating
    (and page-faulting) a whole state per merge. It must match head's keys,
    shapes, dtypes and devices and share no memory with ``head`` or
    ``result``; the inputs are never changed.

    Raises:
        MergeError: alpha not finite or outside [0, 1]; key sets, shapes,
            dtypes or devices differ (the message names the key); ``out``
            does not fit or overlaps an input (see :func:`output_problem`).
    """
    a = _unit("alpha", alpha)
    require_compatible(head, result, "result")
    _require_output(out, head, result)
    beta = 1.0 - a
    new: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            o = None if out is None else out[key]
            if h.is_floating_point():
                new[key] = _blend(h, r, a, beta, o)
            else:
                new[key] = _int_or_bool(h, r, o)
    return new


def validated_vc_asgd(
    head: StateDict,
    result: StateDict,
    alpha: float,
    max_update_norm: float | None = None,
    out: StateDict | None = None,
) -> StateDict | str:
    """:func:`validate_result` then :func:`vc_asgd`, with one pass over the data less.

    Returns the merged state, or, if the result must not be merged, the
    reason :func:`validate_result` gives (same text, same first key). The
    assimilator's hot path: without a norm bound the separate NaN/Inf pass
    over the result is replaced by a norm of each output tensor right after
    it is written (still in cache), and the blend is ``torch.lerp``, one pass
    instead of two (~30% faster than mul+add here). A non-finite output
    means NaN/Inf in the result (lerp propagates them even at ``alpha=1``),
    or lerp's ``result - head`` overflowed (values beyond half the dtype's
    range), or the head itself holds NaN/Inf; the result is then checked
    exactly, and if it is finite that tensor is recomputed with
    :func:`vc_asgd`'s overflow-safe arithmetic. So it accepts, rejects and
    returns what ``validate_result(...) or vc_asgd(...)`` would, up to the
    rounding of lerp (a few ulps; both ends stay exact). With a bound, the
    update norm needs ``result - head`` and :func:`validate_result` runs
    first. ``out`` is as for :func:`vc_asgd`; on rejection its contents are
    unspecified.

    Raises:
        MergeError: alpha or max_update_norm out of range; ``out`` does not
            fit. A bad result is a returned reason, never an exception.
    """
    a = _unit("alpha", alpha)
    if max_update_norm is not None:
        reason = validate_result(head, result, max_update_norm)
    else:
        reason = mismatch(head, result, "result")
    if reason is not None:
        return reason
    _require_output(out, head, result)
    beta = 1.0 - a
    new: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            o = None if out is None else out[key]
            if not h.is_floating_point():
                new[key] = _int_or_bool(h, r, o)
                continue
            t, finite = _lerp_screened(h, r, a, beta, o)
            if not finite:
                bad = nonfinite(r, f"result[{key!r}]")
                if bad is not None:
                    return bad
                t = _blend(h, r, a, beta, o)  # overflow-safe; NaN in head propagates as before
            new[key] = t
    return new


def _lerp_screened(
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
        require_compatible(first, s, f"states[{i}]")
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
    require_compatible(head, result, "result")
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
            f"(missing: {fmt_keys(missing)}; extra: {fmt_keys(extra)}); "
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
    require_compatible(head, result, "result")
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
    grace: int = 0,
) -> float | None:
    """Effective α for a result of staleness ``s = v − v_b`` (DESIGN.md §1).

    * ``"plain"``: ``alpha`` whatever ``s`` (``max_staleness`` is ignored).
    * ``"raise"``: ``α_eff = 1 − (1 − α)/(1 + s')^power`` with
      ``s' = max(0, s − grace)``, so a stale result moves the head less;
      equals ``alpha`` up to ``s = grace``, non-decreasing in ``s``, within
      ``[alpha, 1]``. ``grace``: the staleness a fleet has as a matter of
      course (with N workers nearly every result is N − 1 versions stale),
      which is then not damped; a result resumed from an old checkpoint still is.
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
    if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
        raise MergeError(f"grace must be an integer >= 0, got {grace!r}")

    if policy == "plain":
        return a
    if max_staleness is not None and s > max_staleness:
        return None
    s = max(0, s - grace) if policy == "raise" else s
    if policy == "reject" or s == 0:
        # s == 0 short-circuits because 1 - (1 - a) need not round back to a.
        return a
    eff = 1.0 - (1.0 - a) / (1.0 + s) ** p
    # Clamp to [a, 1]: the same rounding can leave eff an ulp below a for a
    # tiny power; the clamp keeps the documented bounds and monotonicity.
    return min(1.0, max(a, eff))

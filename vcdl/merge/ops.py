"""The merge rules' arithmetic: pure functions from state dicts to state dicts.

This module owns the arithmetic of turning a worker's result into the next
global version, and nothing else (no I/O, no ledger, no store):

* :func:`vc_asgd` — the VC-ASGD assimilation rule
  ``W_{v+1} = α·W_v + (1 − α)·W_c`` (docs/design.md §1). Kijsipongse, Piyatumrong,
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
* :func:`delayed_nesterov` — the asynchronous outer step with delayed
  Nesterov momentum: Liu et al., "Asynchronous Local-SGD Training for
  Language Modeling", 2024, https://arxiv.org/abs/2401.09135.
* :func:`scale_result` — shrink a partial result (a preempted attempt that
  processed a fraction of its shard) towards the head.

The staleness policies are :mod:`vcdl.merge.staleness`; the result checks
(NaN/Inf, foreign architectures, absurd updates) :mod:`vcdl.merge.checks`;
the building blocks shared with the delta rule :mod:`vcdl.merge.elementwise`.

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
from vcdl.merge.checks import (
    fmt_keys,
    mismatch,
    nonfinite,
    require_compatible,
    validate_result,
)
from vcdl.merge.elementwise import (
    blend,
    compute_dtype,
    int_or_bool,
    lerp_screened,
    require_output,
    unit_interval,
)
from vcdl.types import StateDict

"""Names accepted by :func:`staleness_alpha`."""


# --------------------------------------------------------------------------
# Helpers: dtype classes, argument checks, output buffers
# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# Merge rules
# --------------------------------------------------------------------------


def vc_asgd(
    head: StateDict, result: StateDict, alpha: float, out: StateDict | None = None
) -> StateDict:
    """VC-ASGD assimilation: ``alpha * head + (1 - alpha) * result``.

    ``alpha`` is the weight of the current head (``α_e`` of docs/design.md §1), so
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
    a = unit_interval("alpha", alpha)
    require_compatible(head, result, "result")
    require_output(out, head, result)
    beta = 1.0 - a
    new: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            o = None if out is None else out[key]
            if h.is_floating_point():
                new[key] = blend(h, r, a, beta, o)
            else:
                new[key] = int_or_bool(h, r, o)
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
    a = unit_interval("alpha", alpha)
    if max_update_norm is not None:
        reason = validate_result(head, result, max_update_norm)
    else:
        reason = mismatch(head, result, "result")
    if reason is not None:
        return reason
    require_output(out, head, result)
    beta = 1.0 - a
    new: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            o = None if out is None else out[key]
            if not h.is_floating_point():
                new[key] = int_or_bool(h, r, o)
                continue
            t, finite = lerp_screened(h, r, a, beta, o)
            if not finite:
                bad = nonfinite(r, f"result[{key!r}]")
                if bad is not None:
                    return bad
                t = blend(h, r, a, beta, o)  # overflow-safe; NaN in head propagates as before
            new[key] = t
    return new


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
                    acc_i = int_or_bool(acc_i, s[key])  # a fresh tensor each time
                out[key] = h.clone() if acc_i is h else acc_i
                continue
            cdt = compute_dtype(h.dtype)
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
    r = unit_interval("rho", rho)
    return vc_asgd(head, result, 1.0 - r)


def diloco(
    head: StateDict,
    result: StateDict,
    momentum_buf: StateDict | None,
    lr: float = 0.7,
    momentum: float = 0.9,
    nesterov: bool = True,
    base: StateDict | None = None,
) -> tuple[StateDict, StateDict]:
    """DiLoCo outer step with SGD (Nesterov by default) on the pseudo-gradient.

    For each floating tensor::

        g    = start - result               (start = base if given, else head)
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
    if base is not None:
        # A result trained from an older version: its own change is the step.
        require_compatible(head, base, "base")
    float_keys = [k for k, t in head.items() if t.is_floating_point()]
    if momentum_buf is not None:
        _check_buffer(head, float_keys, momentum_buf)

    new: StateDict = {}
    new_buf: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            if not h.is_floating_point():
                new[key] = int_or_bool(h, r)
                continue
            cdt = compute_dtype(h.dtype)
            h_c = h.to(cdt)  # may alias h: only read below
            start = h_c if base is None else base[key].to(cdt)
            g = torch.sub(start, r.to(cdt))  # a fresh tensor
            # No buffer: mu * 0 + g is g itself (aliasing is safe, g is never
            # modified below). Otherwise a fresh tensor: the caller's buffer
            # is not mutated.
            buf = g if momentum_buf is None else torch.add(g, momentum_buf[key].to(cdt), alpha=mu)
            step = torch.add(g, buf, alpha=mu) if nesterov else buf
            new[key] = torch.add(h_c, step, alpha=-lr_f).to(h.dtype)
            new_buf[key] = buf
    return new, new_buf


def delayed_nesterov(
    head: StateDict,
    result: StateDict,
    pending: StateDict | None,
    *,
    lr: float,
    momentum: float,
    delay: int,
    step: int,
    base: StateDict | None = None,
) -> tuple[StateDict, StateDict]:
    """The asynchronous outer step with delayed Nesterov momentum, for one result.

    Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling"
    (https://arxiv.org/abs/2401.09135, Algorithm 3): each result's
    pseudo-gradient is applied at once, without momentum, at 1/N of the outer
    learning rate; the momentum takes one step every N results, on the mean of
    the N pseudo-gradients since its last step, and only then adds its term.
    Over N results the head moves as Nesterov SGD applied once to their mean,
    and no single stale result is amplified by the momentum.

    One buffer per floating tensor holds what the momentum's next step will be
    (``pending = μ·m + Σg/N`` over the results since its last step), so the
    state is shaped like the weights, as :func:`diloco`'s is. With
    ``t = step + 1`` this result's number and, per floating tensor,
    ``g = start − result`` (start = base if given, else head)::

        pending = pending + g / N                   (pending = 0 when None)
        if t % N == 0:  new = head − lr·(g/N + μ·pending);  pending = μ·pending
        else:           new = head − lr·g/N

    With ``N = 1`` this is :func:`diloco`'s Nesterov step exactly. Integer and
    bool tensors as in :func:`vc_asgd`; the buffer in float32 for narrower
    floats, as :func:`diloco`'s.

    Returns:
        ``(new_state, new_pending)``.

    Raises:
        MergeError: mismatched states or buffer, ``lr`` not finite and >= 0,
            ``momentum`` outside [0, 1), ``delay`` < 1, ``step`` < 0.
    """
    lr_f = float(lr)
    if not (math.isfinite(lr_f) and lr_f >= 0.0):
        raise MergeError(f"lr must be finite and >= 0, got {lr!r}")
    mu = float(momentum)
    if not 0.0 <= mu < 1.0:
        raise MergeError(f"momentum must be in [0, 1), got {momentum!r}")
    if int(delay) != delay or delay < 1:
        raise MergeError(f"delay must be an integer >= 1, got {delay!r}")
    if int(step) != step or step < 0:
        raise MergeError(f"step must be an integer >= 0, got {step!r}")
    require_compatible(head, result, "result")
    if base is not None:
        require_compatible(head, base, "base")
    float_keys = [k for k, t in head.items() if t.is_floating_point()]
    if pending is not None:
        _check_buffer(head, float_keys, pending)
    n = int(delay)
    milestone = (int(step) + 1) % n == 0

    new: StateDict = {}
    new_pending: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            if not h.is_floating_point():
                new[key] = int_or_bool(h, r)
                continue
            cdt = compute_dtype(h.dtype)
            h_c = h.to(cdt)  # may alias h: only read below
            start = h_c if base is None else base[key].to(cdt)
            g = torch.sub(start, r.to(cdt)).div_(n)  # a fresh tensor: g / N
            buf = g.clone() if pending is None else torch.add(pending[key].to(cdt), g)
            if milestone:
                new[key] = torch.add(h_c, torch.add(g, buf, alpha=mu), alpha=-lr_f).to(h.dtype)
                buf.mul_(mu)
            else:
                new[key] = torch.add(h_c, g, alpha=-lr_f).to(h.dtype)
            new_pending[key] = buf
    return new, new_pending


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
    f = unit_interval("fraction", fraction)
    require_compatible(head, result, "result")
    out: StateDict = {}
    with torch.no_grad():
        for key, h in head.items():
            r = result[key]
            if not h.is_floating_point():
                out[key] = r.clone()
                continue
            cdt = compute_dtype(h.dtype)
            out[key] = torch.lerp(h.to(cdt), r.to(cdt), f).to(h.dtype)
    return out

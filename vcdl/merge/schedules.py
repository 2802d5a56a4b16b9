"""α schedules: the per-epoch weight of the head in the VC-ASGD merge.

This module owns one pure function, :func:`alpha_schedule`, mapping
``(kind, epoch, epochs, …)`` to ``α_e`` of docs/design.md §1, where the merge is
``W_{v+1} = α_e · W_v + (1 − α_e) · W_c`` (Kijsipongse, Piyatumrong,
U-ruekolan, "A hybrid GPU cluster and volunteer computing platform for
scalable deep learning", J. Supercomputing 74(7):3236–3263, 2018,
https://doi.org/10.1007/s11227-018-2375-9). Raising α over the epochs makes
late, noisy results move a converging model less.

Kinds (``epoch`` is 0-based, ``0 <= epoch < epochs``):

* ``"constant"`` — ``alpha``.
* ``"linear"``   — ``alpha`` at epoch 0 to ``alpha_end`` at ``epochs − 1``.
* ``"cosine"``   — ``alpha_end + (alpha − alpha_end)(1 + cos(π·e/(epochs − 1)))/2``.
* ``"list"``     — ``alphas[epoch]``, the last value once the list runs out.

Linear and cosine return ``alpha`` when ``epochs == 1``; both hit their end
points exactly and are monotone in ``epoch`` (see :func:`_interpolate`).
Invalid arguments raise :class:`~vcdl.errors.ConfigError`, a ``ValueError``,
because they come from the run configuration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vcdl.errors import ConfigError

__all__ = ["SCHEDULES", "alpha_schedule"]

SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine", "list")
"""Names accepted as ``kind`` by :func:`alpha_schedule`."""


def unit_interval(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= v <= 1.0:  # NaN fails too
        raise ConfigError(f"{name} must be a finite number in [0, 1], got {value!r}")
    return v


def _interpolate(start: float, end: float, weight: float, is_last: bool) -> float:
    """``start + (end − start)·weight`` for a weight in [0, 1], made exact at the ends.

    ``start + (end − start)·1`` need not round to ``end``, and can even
    overshoot it by an ulp; so the value is clamped to the interval between
    the end points (clamping preserves monotonicity) and the last epoch
    returns ``end`` itself. ``weight == 0`` gives ``start`` exactly already.
    """
    if is_last:
        return end
    value = start + (end - start) * weight
    return min(max(value, min(start, end)), max(start, end))


def alpha_schedule(
    kind: str,
    epoch: int,
    epochs: int,
    alpha: float,
    alpha_end: float | None = None,
    alphas: Sequence[float] | None = None,
) -> float:
    """α for ``epoch`` (0-based) of a run of ``epochs`` epochs.

    Args:
        kind: one of :data:`SCHEDULES`.
        epoch: 0-based epoch, ``0 <= epoch < epochs``.
        epochs: number of epochs of the run, >= 1.
        alpha: α at epoch 0 (the value for ``"constant"``), in [0, 1].
        alpha_end: α at the last epoch; required for ``"linear"`` and
            ``"cosine"``, in [0, 1].
        alphas: per-epoch values for ``"list"``, each in [0, 1].

    Raises:
        ConfigError (a ValueError): unknown kind, a value outside [0, 1],
            a missing ``alpha_end`` or ``alphas``, an epoch out of range.
    """
    if kind not in SCHEDULES:
        raise ConfigError(f"unknown alpha schedule {kind!r}; allowed: {', '.join(SCHEDULES)}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < epochs:
        raise ConfigError(f"epoch must be an integer in [0, {epochs}), got {epoch!r}")
    a = unit_interval("alpha", alpha)
    a_end = None if alpha_end is None else unit_interval("alpha_end", alpha_end)
    values = (
        None if alphas is None else [unit_interval(f"alphas[{i}]", x) for i, x in enumerate(alphas)]
    )

    if kind == "constant":
        return a
    if kind == "list":
        if not values:
            raise ConfigError("alpha schedule 'list' needs a non-empty alphas list")
        return values[min(epoch, len(values) - 1)]
    if a_end is None:
        raise ConfigError(f"alpha schedule {kind!r} needs alpha_end")
    if epochs == 1 or epoch == 0:
        return a
    t = epoch / (epochs - 1)
    is_last = epoch == epochs - 1
    if kind == "linear":
        return _interpolate(a, a_end, t, is_last)
    # cosine: the weight of alpha_end rises from 0 to 1 along a half cosine.
    return _interpolate(a, a_end, (1.0 - math.cos(math.pi * t)) / 2.0, is_last)

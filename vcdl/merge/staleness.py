"""Staleness policies: the effective α of a result ``s`` versions behind the head.

See :func:`staleness_alpha` and docs/design.md §1. Pure; no I/O.
"""

from __future__ import annotations

import math

from vcdl.errors import MergeError
from vcdl.merge.elementwise import unit_interval

STALENESS_POLICIES: tuple[str, ...] = ("plain", "raise", "reject")


def staleness_alpha(
    alpha: float,
    staleness: int,
    policy: str = "plain",
    power: float = 1.0,
    max_staleness: int | None = None,
    grace: int = 0,
) -> float | None:
    """Effective α for a result of staleness ``s = v − v_b`` (docs/design.md §1).

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
    a = unit_interval("alpha", alpha)
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

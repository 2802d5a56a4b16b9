"""A worker's clock against the driver's, bounded by the round trip that measured it.

Pure: the samples come from :mod:`vcdl.fleetcheck.gather`. One sample is
``(sent, worker, received)``: the driver's wall clock before asking, the
worker's when it answered, the driver's when the answer came back. The
worker read its clock somewhere inside ``[sent, received]``, so its offset
is ``worker - (sent + received) / 2`` give or take half the round trip
(NTP's estimate, without assuming the two legs are equal). Of several
samples the one with the shortest round trip is kept: its bound is the
tightest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict


class Skew(TypedDict):
    """A worker clock's offset from the driver's (seconds; positive: the worker is ahead)."""

    skew_s: float
    #: The true offset is within ``skew_s ± bound_s``.
    bound_s: float


def estimate(samples: Sequence[tuple[float, float, float]]) -> Skew | None:
    """The offset from the tightest sample; None without a usable one."""
    usable = [s for s in samples if s[2] >= s[0]]
    if not usable:
        return None
    sent, worker, received = min(usable, key=lambda s: s[2] - s[0])
    return {
        "skew_s": round(worker - (sent + received) / 2, 6),
        "bound_s": round((received - sent) / 2, 6),
    }


def surely_over(skew: Skew, limit: float) -> bool:
    """True only when even the most favourable reading of ``skew`` exceeds ``limit``."""
    return abs(skew["skew_s"]) - skew["bound_s"] > limit

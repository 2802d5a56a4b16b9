"""A link's profile and its live state: the delays, the cuts, and what a cut does.

A :class:`LinkProfile` is what an operator would measure on a real link:
round-trip latency, jitter, bandwidth, loss. A :class:`Link` is one link of
the running fleet, shared by every proxied connection that crosses it; the
proxy (:mod:`.proxy`) asks it how long to hold each chunk and whether the
link is cut, and :mod:`.netns` shapes its bandwidth with ``tbf``.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CUT_MODES", "CutMode", "Link", "LinkProfile"]

CutMode = Literal["stall", "reset", "down"]
CUT_MODES: tuple[CutMode, ...] = ("stall", "reset", "down")

# Linux's minimum retransmission timeout: a lost TCP segment that fast
# retransmit does not recover costs at least this much.
MIN_RTO_S = 0.2


@dataclass(frozen=True)
class LinkProfile:
    """What a link adds: ``latency_ms`` of round trip, ``jitter_ms`` spread, ``mbit`` cap, ``loss``.

    ``loss`` is not packet loss (a userspace proxy over TCP never sees a lost
    packet: the kernel retransmits it): with that probability a chunk is held
    one retransmission timeout longer, the cost a lost segment has for TCP.
    """

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    mbit: float | None = None
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.latency_ms < 0 or self.jitter_ms < 0:
            raise ValueError("latency_ms and jitter_ms must be >= 0")
        if self.mbit is not None and self.mbit <= 0:
            raise ValueError("mbit must be > 0 (None: unshaped)")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError("loss must be in [0, 1)")

    def one_way_s(self, rng: random.Random) -> float:
        """One chunk's hold in one direction: half the round trip, +- half the jitter, any loss."""
        half = self.latency_ms / 2000.0
        if self.jitter_ms:
            half += rng.uniform(-self.jitter_ms, self.jitter_ms) / 2000.0
        if self.loss and rng.random() < self.loss:
            half += max(MIN_RTO_S, self.latency_ms / 1000.0)
        return max(0.0, half)


@dataclass
class Link:
    """One link of the fleet (a worker host's, or the driver's): its profile and cut state.

    Only the proxy's event loop reads and changes it (the fleet hands its
    calls to that loop), so it needs no lock.
    """

    name: str
    profile: LinkProfile = field(default_factory=LinkProfile)
    cut_until: float = 0.0
    cut_mode: CutMode = "stall"
    rng: random.Random = field(default_factory=random.Random)
    # Wakes the connections a stall holds when the cut ends early (uncut()).
    changed: asyncio.Event | None = None
    # Bytes the proxy carried over the link, by route: what crossed it.
    carried: dict[str, int] = field(default_factory=dict)

    def cut_left(self) -> float:
        """Seconds the current cut still lasts (0 when the link is up)."""
        return max(0.0, self.cut_until - time.monotonic())

    def resets(self) -> bool:
        """Whether connections over the link are refused now (a ``reset`` cut)."""
        return self.cut_mode == "reset" and self.cut_left() > 0

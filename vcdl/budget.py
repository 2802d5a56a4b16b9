"""Which attempts of a subtask count against ``fault.max_attempts``.

The budget is there to stop a subtask that cannot succeed (a poison shard, a
broken worker environment, an attempt that kills its worker every time) from
being retried forever. A spot fleet also kills healthy attempts, and on a
busy fleet four kills of one subtask are a matter of time: counting them
failed shards whose every attempt was making progress.

So a killed attempt is free when it moved the subtask forward: its last
checkpoint holds more samples than any earlier attempt of the subtask
reached (its replacement resumes there). A subtask whose attempts keep dying
at the same point (out of memory at one batch) stops moving forward, and
those deaths count. Progress is bounded by the shard's samples, so free
attempts are too. Attempts that failed, timed out or were rejected always
count.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class _AttemptLike(Protocol):
    @property
    def number(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def samples(self) -> int | None: ...


def free_attempts(attempts: Iterable[_AttemptLike]) -> int:
    """Killed attempts of one subtask that checkpointed further than any before them.

    ``samples`` of an attempt that was killed is its last checkpoint's (the
    ledger updates it with each checkpoint, counting the samples it resumed
    from), or None when it never checkpointed.
    """
    frontier, free = 0, 0
    for a in sorted(attempts, key=lambda a: a.number):
        reached = a.samples or 0
        if a.state == "killed" and reached > frontier:
            free += 1
        frontier = max(frontier, reached)
    return free

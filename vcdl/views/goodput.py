"""Training seconds and goodput: how much of the training reached a merged version.

Per attempt, from the ledger's rows: the seconds it trained
(:func:`training_seconds`), the part of them a merged version holds
(:func:`useful_training_seconds`: all of a merged attempt's, and a killed
attempt's training up to the checkpoint a merged replacement resumed,
:func:`salvaged_attempts`). Goodput = useful / all training seconds. Status,
the epoch tables and the cost report count with these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vcdl.ledger import Attempt


def salvaged_attempts(attempts: Iterable[Attempt]) -> dict[str, float]:
    """Unmerged attempts whose checkpoint went into a merged result, and its seconds.

    Follows ``resumed_from`` back from every merged attempt: A resumed by B
    resumed by C, merged, salvages A and B. Each source maps to the training
    its resumer read from the checkpoint (``resumed_seconds``), not to what
    it recorded later: a source that lived on (a worker leaving under a
    notice finishes its attempt) trained past the checkpoint for nothing.
    Resumes recorded before that column fall back to the source's seconds.
    """
    by_id = {a.id: a for a in attempts}
    salvaged: dict[str, float] = {}
    for a in by_id.values():
        if a.state != "merged":
            continue
        resumer = a
        while resumer.resumed_from is not None and resumer.resumed_from in by_id:
            source = by_id[resumer.resumed_from]
            if source.id in salvaged:
                break
            seconds = resumer.resumed_seconds
            salvaged[source.id] = seconds if seconds is not None else (source.train_seconds or 0.0)
            resumer = source
    return salvaged


def training_seconds(attempt: Attempt) -> float:
    """Seconds an attempt spent training, as goodput counts them.

    Its ``train_seconds``; for one killed or timed out (whose
    ``train_seconds``, if any, reach only its last checkpoint) and for one
    that never reported them, its wall time to when its end was recorded,
    an upper bound.
    """
    wall = (
        (attempt.finished_at - attempt.started_at).total_seconds()
        if attempt.finished_at is not None
        else None
    )
    if attempt.state in ("killed", "timeout") and wall is not None:
        return max(0.0, wall)
    if attempt.train_seconds is not None:
        return attempt.train_seconds
    return max(0.0, wall) if wall is not None else 0.0


def useful_training_seconds(attempt: Attempt, salvaged: Mapping[str, float]) -> float:
    """The part of :func:`training_seconds` that reached a merged version.

    All of a merged attempt's; for one in ``salvaged``
    (:func:`salvaged_attempts`), the training its resumer took over from the
    checkpoint; nothing of any other.
    """
    if attempt.state == "merged":
        return training_seconds(attempt)
    if attempt.id in salvaged:
        return min(salvaged[attempt.id], training_seconds(attempt))
    return 0.0


def salvaged_seconds(attempts: Iterable[Attempt], salvaged: Mapping[str, float]) -> float:
    """The training kept in checkpoints that merged results resumed (``vcdl status``)."""
    return sum(useful_training_seconds(a, salvaged) for a in attempts if a.id in salvaged)

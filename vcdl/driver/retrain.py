"""The retrain flow's pure decisions: which run to warm-start from, whether the data changed.

Nothing here talks to Prefect or the ledger; ``flows/retrain.py`` reads the
facts and acts on these answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from vcdl.ledger import Evaluation, Run, evaluation_metrics


@dataclass(frozen=True)
class RetrainDecision:
    skip: bool
    reason: str


def latest_descendant(runs: Iterable[Run], root: str) -> Run | None:
    """The newest completed run in ``root``'s warm-start lineage (``root`` itself included).

    Nightly retrains chain: each warm-starts from the previous one, so the
    model keeps what every earlier retrain learned.
    """
    by_name = {r.name: r for r in runs}
    if root not in by_name:
        return None
    family, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for r in by_name.values():
            if r.parent_run == parent and r.name not in family:
                family.add(r.name)
                frontier.append(r.name)
    done = [by_name[n] for n in family if by_name[n].state == "completed"]
    if not done:
        return by_name[root]
    return max(done, key=lambda r: (r.created_at, r.name))


def retrain_decision(current: str, previous: str | None, force: bool = False) -> RetrainDecision:
    """Retrain unless the data set's fingerprint equals the one the source was trained on."""
    if force:
        return RetrainDecision(False, "forced")
    if previous is None:
        return RetrainDecision(False, "the source run's data fingerprint is unknown")
    if previous == current:
        return RetrainDecision(True, f"data unchanged since the source run ({current})")
    return RetrainDecision(False, f"data changed: {previous} -> {current}")


def pick_version(
    spec: int | str,
    head: int,
    evaluations: Iterable[Evaluation],
    metric: str = "accuracy",
    higher_is_better: bool = True,
) -> int:
    """The version to warm-start from: ``"head"``, ``"best"`` or a number.

    ``"best"`` is the best test evaluation by ``metric`` (the objective's
    headline: accuracy, higher is better; loss, lower is better), the newest
    of equals.
    """
    if isinstance(spec, int):
        return spec
    if spec == "head":
        return head
    if spec == "best":
        sign = 1.0 if higher_is_better else -1.0
        scored = [
            (sign * value, e.version)
            for e in evaluations
            if e.split == "test"
            and (value := evaluation_metrics(e).get(metric)) is not None
            and math.isfinite(value)  # a diverged version's NaN is never the best
        ]
        return max(scored)[1] if scored else head
    if str(spec).isdigit():
        return int(spec)
    raise ValueError(f"version must be 'head', 'best' or a number, got {spec!r}")

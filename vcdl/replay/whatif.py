"""What-if: a run re-executed with one of its merged results rejected, into a new run.

:func:`what_if` replays run ``RUN`` (:mod:`vcdl.replay.runner`'s re-training,
from the plan of :mod:`vcdl.replay.plan`) into a new run ``NEW`` in the same
ledger and store, leaving out one attempt's merge. Every other attempt is
re-trained with its recorded inputs from its base *as the new run has it*
(the version that stood in the new run where the original's base stood),
recorded in the new run's ledger as an attempt of worker ``replay``, its
result written to the store, and merged by the real assimilator
(:func:`~vcdl.driver.assimilator.merge_attempt`) in the original's order: α
and staleness follow the new run's own lineage. ``vcdl diff RUN NEW``
(:mod:`vcdl.replay.diff`) then shows where the two part.

The new run keeps the replayed versions in memory while it is made (they
are read back for later attempts' bases): meant for the models a what-if is
asked of, not for one larger than the driver's memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.head_cache import head_cache
from vcdl.driver.runs import prepare_run
from vcdl.ledger import Attempt
from vcdl.merge.codec import encode
from vcdl.replay.plan import NotReplayable, ReplayPlan, plan_replay, replay_inputs
from vcdl.replay.runner import Progress, _ensure, _Replayer
from vcdl.runtime import RunRef
from vcdl.store.paths import result_path
from vcdl.types import StateDict


@dataclass
class WhatIfReport:
    """The new run made, and how its versions map to the original's."""

    run: str
    new_run: str
    rejected: str
    versions: dict[int, int]  # the original's version -> the new run's version then
    merged: int
    head: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pick_attempt(plan: ReplayPlan, ident: str) -> str:
    """The merged attempt of ``plan`` whose id is or starts with ``ident``."""
    found = {m.attempt_id for m in plan.merges if m.attempt_id.startswith(ident)}
    if len(found) != 1 or not ident:
        what = "no merged attempt" if not found else f"{len(found)} merged attempts"
        raise NotReplayable(f"--reject {ident[:40]!r}: {what} of run {plan.run!r} start so")
    return found.pop()


class _Into(_Replayer):
    """A replayer whose versions are the new run's: an original version number maps to the
    version that stood in the new run at that point."""

    def __init__(self, ref: RunRef, plan: ReplayPlan, attempts: dict[str, Attempt]) -> None:
        super().__init__(ref, plan, attempts)
        self.mapped: dict[int, int] = {0: 0}
        self.made: dict[int, StateDict] = {}

    def version(self, number: int) -> StateDict:
        if not self.made:  # the new run's v0 is the original's
            self.made[0] = super().version(0)
        return self.made[self.mapped[number]]


def what_if(
    ref: RunRef, new_name: str, *, reject: str, progress: Progress | None = None
) -> WhatIfReport:
    """Re-execute ``ref``'s run without the merge of attempt ``reject`` into run ``new_name``."""
    ledger = ref.ledger(fenced=False)
    if ledger.find_run(new_name) is not None:
        raise NotReplayable(f"run {new_name!r} exists already: name a new run with --as")
    attempts = {a.id: a for a in ledger.attempts(ref.run)}
    plan = plan_replay(ref.run, ledger.versions(ref.run), list(attempts.values()))
    rejected = pick_attempt(plan, reject)
    r = _Into(ref, plan, attempts)
    cfg = r.cfg.updated(run={"name": new_name})
    new_ref, _, _ = prepare_run(cfg, init_state=r.version(0), parent=(ref.run, 0))
    new_ledger, store, cache = new_ref.ledger(), new_ref.store(), head_cache(cfg)
    new_ledger.update_run(new_name, state="running")
    by_key = {t.key: t for t in plan.trainings}
    head = merged = 0
    for i, step in enumerate(plan.merges):
        if step.attempt_id == rejected:
            r.mapped[step.number] = head  # as if its result had been refused
            continue
        _ensure(r, step.training, by_key)
        result = r.done[step.training]
        a = attempts[step.attempt_id]
        new_ledger.ensure_subtasks(new_name, step.epoch, cfg.data.shards)
        base = r.mapped[step.base_version]
        attempt = new_ledger.start_attempt(new_name, step.epoch, step.shard, "replay", base)
        t = by_key[step.training]
        inputs = replay_inputs(a)
        if inputs is not None and not (t.resumed_from or t.optimizer_from or t.variable_from):
            # Trained as recorded, from this run's base: the new run replays it too. One that
            # continued another attempt's training is left without (the source is not in
            # the new run): the new run then says it cannot be replayed.
            new_ledger.record_replay_inputs(attempt.id, {**inputs, "replayed_from": a.id})
        precision = cfg.merge.result_precision
        stored = (
            result.state if precision == "full" else encode(result.state, r.made[base], precision)
        )
        path = result_path(new_name, step.epoch, step.shard, attempt.id)
        store.write_state(
            path,
            stored,
            attrs={
                "encoding": precision,
                "run": new_name,
                "epoch": step.epoch,
                "shard": step.shard,
                "attempt": attempt.id,
                "base_version": base,
                "samples": result.samples,
                "planned_samples": result.planned_samples,
                "replayed_from": a.id,
            },
        )
        new_ledger.finish_attempt(
            attempt.id,
            state="interrupted" if result.interrupted else "finished",
            result_uri=path,
            samples=result.samples,
            loss=result.mean_loss,
            train_seconds=result.train_seconds,
        )
        outcome = merge_attempt(new_ref, attempt.id, cfg, cache)
        if outcome.kind == "merged" and outcome.version is not None:
            head, merged = outcome.version, merged + 1
            row = new_ledger.get_version(new_name, head)
            r.made[head] = store.read_state(row.uri, expect=row.checksum)
        r.mapped[step.number] = head
        if progress is not None:
            progress(i + 1, len(plan.merges), step.number)
    new_ledger.update_run(new_name, state="completed", epochs_completed=cfg.run.epochs)
    return WhatIfReport(ref.run, new_name, rejected, dict(r.mapped), merged, head)

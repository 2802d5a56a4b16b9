"""What-if: a run re-executed with one change, into a new run.

:func:`what_if` replays run ``RUN`` (:class:`~vcdl.replay.replayer.Replayer`,
from the plan of :mod:`vcdl.replay.plan`) into a new run ``NEW`` in the same
ledger and store, with one change (:mod:`vcdl.replay.change`): one attempt's
merge left out (``--reject``), or the merges from version ``--from`` on made
with another α (``--alpha``, constant) or rule (``--rule``). Every merged
attempt is re-trained with its recorded inputs from its base *as the new run
has it* (the version that stood in the new run where the original's base
stood), recorded in the new run's ledger as an attempt of worker ``replay``,
its result written to the store, and merged by the real assimilator
(:func:`~vcdl.driver.assimilator.merge_attempt`) in the original's order,
with the original's merge settings before the change and the new ones from
it on: α and staleness follow the new run's own lineage. So the attempts
after the change train from the changed versions, as they would have; what
stays the original's is the schedule (which version each started from, the
merge order). ``vcdl diff RUN NEW`` (:mod:`vcdl.replay.diff`) then shows
where the two part.

The new run keeps the replayed versions in memory while it is made (they
are read back for later attempts' bases): meant for the models a what-if is
asked of, not for one larger than the driver's memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.head_cache import head_cache
from vcdl.driver.merge_plan import SIZE_SHARE
from vcdl.driver.runs import prepare_run
from vcdl.ledger import Attempt, Ledger
from vcdl.ledger.models import FOLDED_CHECKSUM
from vcdl.merge.codec import encode
from vcdl.merge.rules import rule_of
from vcdl.replay.change import Change, plan_change, request_problem
from vcdl.replay.plan import NotReplayable, ReplayPlan, plan_replay, replay_inputs
from vcdl.replay.replayer import Progress, Replayer, ensure_trained
from vcdl.runtime import RunRef
from vcdl.store.paths import result_path, rule_state_path
from vcdl.types import StateDict


@dataclass
class WhatIfReport:
    """The new run made, and how its versions map to the original's."""

    run: str
    new_run: str
    change: str  # the change in words
    rejected: str | None  # --reject: the attempt's whole id
    alpha: float | None  # --alpha
    rule: str | None  # --rule: the new run's rule (None: the run's)
    first: int  # the first of the run's versions whose merge the change concerns
    versions: dict[int, int]  # the original's version -> the new run's version then
    merged: int
    head: int
    same_before: bool
    """The new run's versions before ``first`` are the original's, checksum for checksum."""
    refused: list[str] = field(default_factory=list)
    """Attempts whose result the new run's merge refused (a rule's check), with the reason."""
    unreplayable: int = 0
    """Attempts recorded without replay inputs (they continued another attempt's training)."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pick_attempt(plan: ReplayPlan, ident: str) -> str:
    """The merged attempt of ``plan`` whose id is or starts with ``ident``."""
    found = {m.attempt_id for m in plan.merges if m.attempt_id.startswith(ident)}
    if len(found) != 1 or not ident:
        what = "no merged attempt" if not found else f"{len(found)} merged attempts"
        raise NotReplayable(f"--reject {ident[:40]!r}: {what} of run {plan.run!r} start so")
    return found.pop()


class _Into(Replayer):
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
    ref: RunRef,
    new_name: str,
    *,
    reject: str | None = None,
    alpha: float | None = None,
    rule: str | None = None,
    first: int | None = None,
    progress: Progress | None = None,
) -> WhatIfReport:
    """Re-execute ``ref``'s run into run ``new_name`` with one change: without the merge of
    attempt ``reject``, or with α ``alpha`` (constant) and/or rule ``rule`` for the merges
    from version ``first`` on (default: all). Refusals (:mod:`vcdl.replay.change`) come
    before anything is written."""
    change = Change(reject, alpha, rule, first)
    problem = request_problem(change)
    if problem is not None:
        raise NotReplayable(problem)
    ledger = ref.ledger(fenced=False)
    if ledger.find_run(new_name) is not None:
        raise NotReplayable(f"run {new_name!r} exists already: name a new run with --as")
    attempts = {a.id: a for a in ledger.attempts(ref.run)}
    plan = plan_replay(ref.run, ledger.versions(ref.run), list(attempts.values()))
    r = _Into(ref, plan, attempts)
    before = r.cfg.updated(run={"name": new_name})
    notes: list[str] = []
    rejected: str | None = None
    if reject is not None:
        rejected = picked = pick_attempt(plan, reject)
        start = next(m.number for m in plan.merges if m.attempt_id == picked)
        after, rule_before, rule_changed = before, before.merge.rule, False
        what = f"without attempt {picked[:12]}"
    else:
        planned = plan_change(r.cfg, plan, change)
        after = before.updated(merge=planned.merge)
        start, notes = planned.first, list(planned.notes)
        rule_before, rule_changed = planned.rule_before, planned.changes_rule
        what = ", ".join(
            ([f"rule {planned.rule_after}"] if rule is not None else [])
            + ([f"α {alpha} (constant)"] if alpha is not None else [])
        ) + (f" from version {start} on" if start > 1 else "")
    new_ref, _, _ = prepare_run(after, init_state=r.version(0), parent=(ref.run, 0))
    new_ledger, store, cache = new_ref.ledger(), new_ref.store(), head_cache(after)
    new_ledger.update_run(new_name, state="running")
    by_key = {t.key: t for t in plan.trainings}
    head = merged = unreplayable = 0
    refused: list[str] = []
    for i, step in enumerate(plan.merges):
        if step.attempt_id == rejected:
            r.mapped[step.number] = head  # as if its result had been refused
            continue
        cfg = before if step.number < start else after
        if step.number == start and rule_changed and not rule_of(after).keeps_state:
            # The original rule's state beside the head is read by nobody from here on.
            kept = rule_state_path(new_name, new_ledger.head(new_name).uri)
            if store.exists(kept):
                store.delete(kept)
        ensure_trained(r, step.training, by_key)
        result = r.done[step.training]
        a = attempts[step.attempt_id]
        share = r.size_share(step.epoch, step.shard)
        # The original's throughput plan (rows per shard) goes with its epoch, so the new
        # run's shards have the rows they trained and its merges weigh them alike.
        new_ledger.ensure_subtasks(new_name, step.epoch, cfg.data.shards, rows=r.sizes[step.epoch])
        base = r.mapped[step.base_version]
        attempt = new_ledger.start_attempt(new_name, step.epoch, step.shard, "replay", base)
        t = by_key[step.training]
        inputs = replay_inputs(a)
        if inputs is not None and not (t.resumed_from or t.optimizer_from or t.variable_from):
            # Trained as recorded, from this run's base: the new run replays it too. One that
            # continued another attempt's training is left without (the source is not in
            # the new run): the new run then says it cannot be replayed.
            recorded: dict[str, Any] = {**inputs, "replayed_from": a.id}
            recorded.pop("merge_rule", None)
            if rule_changed and step.number < start:
                # Merged by the original's rule, not the new run's: its replay must know.
                recorded["merge_rule"] = rule_before
            new_ledger.record_replay_inputs(attempt.id, recorded)
        else:
            unreplayable += 1
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
                **({SIZE_SHARE: share} if share is not None else {}),
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
        else:
            refused.append(f"{a.id[:12]} (v{step.number}): {outcome.reason or outcome.kind}")
        r.mapped[step.number] = head
        if progress is not None:
            progress(i + 1, len(plan.merges), step.number)
    new_ledger.update_run(new_name, state="completed", epochs_completed=after.run.epochs)
    same = _same_before(ledger, ref.run, new_name, r.mapped, start)
    if not same:
        devices = ", ".join(d for d in plan.devices if d != "cpu")
        notes.append(
            f"the new run's versions before version {start} differ from the original's"
            + (
                f" (attempts trained on {devices} do not re-train bit for bit on this CPU)"
                if devices
                else ""
            )
        )
    if refused:
        notes.append(
            f"the new run's merge refused {len(refused)} results: " + "; ".join(refused[:5])
        )
    if unreplayable:
        notes.append(
            f"{unreplayable} attempts continued another's training (a checkpoint, an optimizer "
            "state, an EASGD variable) and are recorded without replay inputs: the new run's "
            "own replay says it cannot be replayed"
        )
    return WhatIfReport(
        ref.run,
        new_name,
        what,
        rejected,
        alpha,
        rule,
        start,
        dict(r.mapped),
        merged,
        head,
        same,
        refused,
        unreplayable,
        notes,
    )


def _same_before(
    ledger: Ledger, run: str, new_run: str, mapped: dict[int, int], start: int
) -> bool:
    """The new run's versions before ``start`` have the original's checksums (a folded one,
    which has none, is not compared)."""
    old = {v.number: v.checksum for v in ledger.versions(run)}
    new = {v.number: v.checksum for v in ledger.versions(new_run)}
    return all(
        new.get(mapped[n]) == old[n]
        for n in range(1, start)
        if old.get(n) not in (None, FOLDED_CHECKSUM)
    )


def what_if_text(report: WhatIfReport) -> str:
    """The new run in a line, then the notes (``vcdl replay RUN --as NEW`` without --json)."""
    lines = [
        f"run {report.new_run}: {report.run} {report.change}, {report.merged} merges, head "
        f"v{report.head}; vcdl diff {report.run} {report.new_run}"
    ]
    if report.first > 1:
        same = (
            "the original's, checksum for checksum" if report.same_before else "NOT the original's"
        )
        lines.append(f"  versions before {report.first}: {same}")
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)

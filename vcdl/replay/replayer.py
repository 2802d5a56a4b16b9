"""The machinery a replay and a what-if share: versions made so far, trainings done, merges.

:class:`Replayer` holds a replay's memory (the versions re-made, the attempts
re-trained, what it cost) and does its two steps: :meth:`Replayer.train`
re-trains one attempt (:mod:`vcdl.replay.retrain`) from its base, the
checkpoint, optimizer state or EASGD variable it continued;
:meth:`Replayer.merge` re-makes one recorded merge (the recorded α, a partial
result's share, the rule's state, a reduced-precision result encoded and
decoded against its base). :func:`ensure_trained` trains an attempt after
every training it continues from, and :func:`last_use` says when a version
can be dropped from memory. :func:`vcdl.replay.runner.replay_run` (compare
each version with the record) and :func:`vcdl.replay.whatif.what_if` (merge
into a new run instead) are built on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vcdl.driver.merge_plan import blend_of
from vcdl.driver.throughput import planned_sizes, share_of
from vcdl.ledger import Attempt
from vcdl.merge.codec import decode, encode
from vcdl.merge.rules import MergeRule, merge_rule, rule_of
from vcdl.replay.plan import MergeStep, ReplayPlan, Training
from vcdl.replay.retrain import retrain
from vcdl.runtime import RunRef
from vcdl.types import StateDict
from vcdl.worker.loop import TrainResult

__all__ = ["Progress", "Replayer", "continued_from", "ensure_trained", "last_use"]

Progress = Callable[[int, int, int], None]
"""Called after each version: (versions done, versions in all, the version)."""

TrainingKey = tuple[str, int | None]


class Replayer:
    """The replay's memory: versions made so far, trainings done, the rule's state."""

    def __init__(self, ref: RunRef, plan: ReplayPlan, attempts: dict[str, Attempt]) -> None:
        self.ref, self.plan, self.attempts = ref, plan, attempts
        self.cfg = ref.config()
        self.store, self.ledger = ref.store(), ref.ledger(fenced=False)
        self.rule = rule_of(self.cfg)
        self._rules: dict[str, MergeRule] = {self.rule.name: self.rule}
        self.versions: dict[int, StateDict] = {}
        self.done: dict[TrainingKey, TrainResult] = {}
        self.train_seconds = 0.0
        self.loop_seconds = 0.0
        self.original = 0.0
        self.planned: dict[tuple[int, int], int] = {}
        self.sizes: dict[int, list[int] | None] = {}  # each epoch's throughput plan

    def size_share(self, epoch: int, shard: int) -> float | None:
        """The shard's size relative to its epoch's mean shard, from the recorded plan."""
        if epoch not in self.sizes:
            self.sizes[epoch] = planned_sizes(self.ref, self.cfg, epoch)
        return share_of(self.sizes[epoch], shard)

    def rule_of(self, step: MergeStep) -> MergeRule:
        """The rule that made ``step``'s version: the run's, or the one its attempt's replay
        inputs name (a what-if that changed the rule from a version on merged the versions
        before it with the original's rule)."""
        name = step.rule or self.rule.name
        if name not in self._rules:
            settings = self.cfg.merge.model_copy(update={"rule": name})
            self._rules[name] = merge_rule(settings, workers=self.cfg.cluster.workers)
        return self._rules[name]

    def version(self, number: int) -> StateDict:
        if number not in self.versions:
            row = self.ledger.get_version(self.ref.run, number)
            self.versions[number] = self.store.read_state(row.uri, expect=row.checksum)
        return self.versions[number]

    def stored(self, step: MergeStep) -> StateDict | None:
        """The version's stored weights as they are (unverified: to name what differs)."""
        if not step.kept:
            return None
        return self.store.read_state(
            self.ledger.get_version(self.ref.run, step.number).uri, verify=False
        )

    def version_from_store(self, number: int) -> StateDict:
        row = self.ledger.get_version(self.ref.run, number)
        return self.store.read_state(row.uri, expect=row.checksum)

    def train(self, t: Training) -> TrainResult:
        if t.key in self.done:
            return self.done[t.key]
        a = self.attempts[t.attempt_id]

        def carried(key: TrainingKey | None) -> TrainResult | None:
            return None if key is None else self.done[key]

        resumed = carried(t.resumed_from)
        opt = carried(t.optimizer_from)
        var = carried(t.variable_from)
        began = time.perf_counter()
        result = retrain(
            self.ref,
            self.cfg,
            t,
            base=self.version(t.base_version),
            checkpoint=resumed.state if resumed is not None else None,
            # train_attempt loads a copy: the kept state stays as it ended.
            optimizer_state=opt.optimizer_state if opt is not None else None,
            variable=var.state if var is not None else None,
            samples=t.samples if t.samples is not None else (a.samples or 1 << 62),
        )
        self.train_seconds += time.perf_counter() - began
        self.loop_seconds += result.train_seconds
        self.original += a.train_seconds or 0.0
        self.done[t.key] = result
        return result

    def merge(self, step: MergeStep, rule_state: StateDict | None) -> tuple[Any, TrainResult]:
        result = self.done[step.training]
        a = self.attempts[step.attempt_id]
        base = self.version(step.base_version)
        weights = result.state
        precision = self.cfg.merge.result_precision
        if precision != "full":
            weights = decode(encode(weights, base, precision), base, precision)
        planned = result.planned_samples
        fraction = None
        if a.samples is not None and planned and a.samples < planned:
            # A partial result counts for its share (vcdl.driver.merge_plan.Candidate).
            fraction = min(1.0, a.samples / planned)
        # A throughput plan's shard weighs by its size, as the driver weighed it.
        blend = blend_of(step.alpha, fraction, self.size_share(a.epoch, a.shard))
        head = self.version(step.number - 1)
        rule = self.rule_of(step)
        applied = rule.apply(
            head,
            weights,
            blend,
            base=base if rule.reads_base else None,
            state=rule_state,
        )
        return applied, result


def continued_from(t: Training) -> list[TrainingKey]:
    """The trainings ``t`` continues: the checkpoint it resumed, the optimizer state and
    EASGD variable it carried."""
    return [k for k in (t.resumed_from, t.optimizer_from, t.variable_from) if k is not None]


def ensure_trained(r: Replayer, key: TrainingKey, by_key: dict[Any, Training]) -> None:
    """Train ``key`` and, first, every training it continues from (iteratively: chains of
    carried optimizer states can be long)."""
    stack = [key]
    while stack:
        t = by_key[stack[-1]]
        todo = [k for k in continued_from(t) if k not in r.done]
        if todo:
            stack += todo
            continue
        stack.pop()
        if t.key not in r.done:
            r.train(t)


def last_use(plan: ReplayPlan, by_key: dict[Any, Training]) -> dict[int, int]:
    """Per version, the index of the last merge step that reads it (as a base of a training
    done for that step, the result's base, or the head)."""
    last: dict[int, int] = {}
    seen: set[TrainingKey] = set()
    for i, step in enumerate(plan.merges):
        todo = [step.training]
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            t = by_key[key]
            last[t.base_version] = i
            todo += continued_from(t)
        last[step.base_version] = i
        last[step.number - 1] = i
    return last

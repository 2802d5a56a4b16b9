"""A replay carried out: re-train, re-merge in the ledger's order, compare each version.

:func:`replay_run` builds the plan (:mod:`vcdl.replay.plan`) from the ledger,
re-trains each attempt it names and merges each result onto the replayed head
in the ledger's order (:class:`~vcdl.replay.replayer.Replayer`, shared with
the what-if: the recorded α, a partial result's share, the rule's state
carried from the previous merge, a reduced-precision result encoded and
decoded against its base as the worker and the driver did), and compares each
new version with the ledger's checksum and, where the store keeps it, with the
stored bytes. It stops at the first divergence and names its version, attempt
and tensor. The result is a :class:`ReplayReport`, as data (``--json``) or text.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from vcdl.replay.plan import MergeStep, NotReplayable, plan_replay
from vcdl.replay.replayer import Progress, Replayer, ensure_trained, last_use
from vcdl.runtime import RunRef
from vcdl.store.layout import combined_checksum, digest, plan_write
from vcdl.store.paths import rule_state_path
from vcdl.types import StateDict

__all__ = ["Progress", "ReplayReport", "first_difference", "replay_run", "state_checksum"]


@dataclass
class Divergence:
    """Where the replay first parted from the record."""

    version: int
    attempt: str
    epoch: int
    shard: int
    kind: str  # checksum (the ledger's), stored (the store's bytes), rejected (the rule refused)
    tensor: str | None
    max_abs_deviation: float | None
    detail: str


@dataclass
class Deviation:
    """How far one replayed version is from the stored one (0.0: bit for bit)."""

    version: int
    max_abs_deviation: float
    tensor: str | None  # where it is largest; None when there is none


@dataclass
class ReplayReport:
    """What a replay found, and what it cost."""

    run: str
    first: int
    last: int
    versions: int  # versions re-made
    compared: int  # of them, compared with a recorded checksum (a fold's inner ones have none)
    trainings: int
    bit_for_bit: bool
    divergence: Divergence | None
    devices: list[str]
    seconds: float
    train_seconds: float  # of ``seconds``, re-training (reading the shards, building models)
    loop_seconds: float  # of ``train_seconds``, the training loops alone
    original_train_seconds: float  # the recorded train_seconds of the attempts re-trained
    notes: list[str] = field(default_factory=list)
    deviations: list[Deviation] = field(default_factory=list)
    """With ``keep_going``: each kept version's largest |Δ| from the stored weights."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def state_checksum(state: StateDict) -> tuple[str, dict[str, str]]:
    """The content identity a store group of ``state`` would have, and each tensor's checksum
    (:func:`~vcdl.store.layout.combined_checksum`, computed without writing)."""
    plan = plan_write(state, "replay")
    records = {
        t.name: {"dtype": t.dtype_name, "shape": list(t.shape), "checksum": digest(t.data)}
        for t in plan.tensors
    }
    return combined_checksum(records), {k: str(r["checksum"]) for k, r in records.items()}


def first_difference(mine: StateDict, other: StateDict) -> tuple[str, float | None] | None:
    """The first tensor (in ``mine``'s order) whose bytes differ, with its largest |Δ|."""
    for name, a in mine.items():
        b = other.get(name)
        if b is None or a.shape != b.shape or a.dtype != b.dtype:
            return name, None
        if not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
            dev = (a.double() - b.double()).abs().max().item() if a.numel() else None
            return name, dev
    extra = sorted(set(other) - set(mine))
    return (extra[0], None) if extra else None


def replay_run(
    ref: RunRef,
    *,
    first: int = 0,
    last: int | None = None,
    progress: Progress | None = None,
    keep_going: bool | None = None,
) -> ReplayReport:
    """Replay ``ref``'s run from version ``first`` to ``last`` (default: its newest version).

    ``keep_going``: after a divergence, go on from the recorded version and report every
    kept version's largest deviation (None: only when some attempt trained on a GPU).
    """
    began = time.perf_counter()
    ledger = ref.ledger(fenced=False)
    attempts = {a.id: a for a in ledger.attempts(ref.run)}
    plan = plan_replay(
        ref.run, ledger.versions(ref.run), list(attempts.values()), first=first, last=last
    )
    r = Replayer(ref, plan, attempts)
    notes: list[str] = []
    if any(d != "cpu" for d in plan.devices):
        notes.append(
            "some attempts trained on "
            + ", ".join(d for d in plan.devices if d != "cpu")
            + ": a CPU replay of them is not expected to be bit for bit"
        )
    if keep_going is None:
        keep_going = any(d != "cpu" for d in plan.devices)
    rule_state: StateDict | None = None
    if r.rule.keeps_state and first > 0:
        row = ledger.get_version(ref.run, first)
        path = rule_state_path(ref.run, row.uri)
        if not r.store.exists(path):
            raise NotReplayable(
                f"rule {r.rule.name} keeps its state only beside the head: replay from version 0"
            )
        rule_state = r.store.read_state(path)
    by_key = {t.key: t for t in plan.trainings}
    dropped_after = last_use(plan, by_key)
    divergence: Divergence | None = None
    deviations: list[Deviation] = []
    compared = made = 0
    for i, step in enumerate(plan.merges):
        ensure_trained(r, step.training, by_key)
        applied, _ = r.merge(step, rule_state)
        made += 1
        if isinstance(applied, str):
            divergence = divergence or Divergence(
                step.number,
                step.attempt_id,
                step.epoch,
                step.shard,
                "rejected",
                None,
                None,
                f"the rule refused the replayed result: {applied}",
            )
            break
        new = applied.weights
        rule_state = applied.state
        if not step.folded:
            compared += 1
            stored = r.stored(step)
            found = _compare(step, new, state_checksum(new)[0], stored)
            if keep_going and stored is not None:
                deviations.append(_deviation(step.number, new, stored))
            if found is not None:
                divergence = divergence or found
                if not keep_going:
                    break
                if found.kind == "checksum" and stored is not None:
                    # Go on from the record, so that each version's deviation is its own
                    # merge's, not the sum of every one before it.
                    new = r.version_from_store(step.number)
        r.versions[step.number] = new
        for n in [n for n in r.versions if n != step.number and dropped_after.get(n, -1) <= i]:
            del r.versions[n]  # no later training or merge reads it
        if progress is not None:
            progress(i + 1, len(plan.merges), step.number)
    return ReplayReport(
        ref.run,
        plan.first,
        plan.last,
        made,
        compared,
        len(r.done),
        divergence is None,
        divergence,
        plan.devices,
        time.perf_counter() - began,
        r.train_seconds,
        r.loop_seconds,
        r.original,
        notes,
        deviations,
    )


def _deviation(number: int, mine: StateDict, stored: StateDict) -> Deviation:
    worst, where = 0.0, None
    for name, a in mine.items():
        b = stored.get(name)
        if b is None or a.shape != b.shape or not a.is_floating_point() or not a.numel():
            continue
        dev = float((a.double() - b.double()).abs().max())
        if dev > worst or (where is None and dev != dev):
            worst, where = dev, name
    return Deviation(number, worst, where)


def _compare(
    step: MergeStep, new: StateDict, checksum: str, stored: StateDict | None
) -> Divergence | None:
    """The replayed version against the ledger's checksum and, if kept, the stored bytes."""
    if checksum != step.checksum:
        diff = first_difference(new, stored) if stored is not None else None
        return Divergence(
            step.number,
            step.attempt_id,
            step.epoch,
            step.shard,
            "checksum",
            diff[0] if diff else None,
            diff[1] if diff else None,
            "the replayed version's checksum differs from the ledger's"
            + ("" if stored is not None else " (its weights are not kept: no tensor to name)"),
        )
    if stored is not None:
        diff = first_difference(new, stored)
        if diff is not None:
            return Divergence(
                step.number,
                step.attempt_id,
                step.epoch,
                step.shard,
                "stored",
                diff[0],
                diff[1],
                "the replay matches the ledger's checksum but the stored weights differ: "
                "the store was changed after the merge",
            )
    return None

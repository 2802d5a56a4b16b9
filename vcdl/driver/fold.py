"""Results that wait together, folded into one version write (``merge.fold``).

This module owns the fold (docs/design.md, "Decisions made since"): k
results of one epoch merged in one streamed pass, in order, each with the α
and staleness it would get one at a time, only the last version written,
the k versions and the head's move recorded in one ledger transaction
(:meth:`~vcdl.ledger.merging.MergeQueries.commit_fold`). Whatever a fold
cannot take goes through :func:`~vcdl.driver.assimilator.merge_attempt`
one result at a time, which treats it exactly as before.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from vcdl.config import RunConfig
from vcdl.driver.assimilator import (
    MergeOutcome,
    base_of,
    delete_groups,
    merge_attempt,
    merged_in,
    open_result,
    read_rule_state,
)
from vcdl.driver.head_cache import HeadCache, head_cache
from vcdl.driver.merge_plan import Candidate, Rejection, plan_merge
from vcdl.driver.streamed import Step, streamed_fold
from vcdl.errors import IntegrityError, StoreError, StoreNotFoundError
from vcdl.ledger.merging import FoldItem, FoldRefused
from vcdl.merge.rules import rule_of
from vcdl.runtime import RunRef
from vcdl.states import MERGEABLE_ATTEMPT_STATES
from vcdl.store.paths import rule_state_path
from vcdl.store.streaming import specs_of


def merge_attempts(
    ref: RunRef,
    attempt_ids: Sequence[str],
    cfg: RunConfig,
    cache: HeadCache | None = None,
) -> list[MergeOutcome]:
    """Merge results that wait together, in order; each outcome as :func:`merge_attempt` gives.

    Several results of one epoch are folded into one version write
    (:func:`fold_attempts`): the same weights, α and staleness as one at a
    time, only the last version stored. Anything a fold does not cover (a
    result to reject, stale or a duplicate, a head moved by another merger)
    makes the whole group merge one at a time, which handles it exactly as
    before; the fold leaves nothing behind in that case.
    """
    cache = cache if cache is not None else head_cache(cfg)
    if len(attempt_ids) > 1:
        folded = fold_attempts(ref, attempt_ids, cfg, cache)
        if folded is not None:
            return folded
    return [merge_attempt(ref, a, cfg, cache) for a in attempt_ids]


def fold_attempts(
    ref: RunRef,
    attempt_ids: Sequence[str],
    cfg: RunConfig,
    cache: HeadCache,
) -> list[MergeOutcome] | None:
    """Fold the results of ``attempt_ids`` into the head and write only the last version.

    Returns their outcomes (all "merged", versions head + 1 .. head + k), or
    None having changed nothing when the fold does not apply: an attempt
    not mergeable, results of different epochs, a result to reject (bad,
    unreadable, stale), a base unreadable, or the ledger refusing the fold
    (:class:`~vcdl.ledger.merging.FoldRefused`). The version groups between
    are never written; the ledger records them as pruned
    (:data:`~vcdl.ledger.models.FOLDED_CHECKSUM`).
    """
    ledger, store = ref.ledger(), ref.store()
    rule = rule_of(cfg)
    timings: dict[str, float] = {}
    attempts = [ledger.get_attempt(a) for a in attempt_ids]
    if len({a.epoch for a in attempts}) != 1 or any(
        a.state not in MERGEABLE_ATTEMPT_STATES or a.result_uri is None for a in attempts
    ):
        return None
    opened = []
    for attempt in attempts:
        got = open_result(ref, attempt, cfg, cache, timings)
        if isinstance(got, str):
            return None
        opened.append(got)

    t = time.perf_counter()
    head_row = ledger.head(ref.run)
    head = cache.get(head_row, functools.partial(store.read_state, expect=head_row.checksum))
    timings["read_head"] = time.perf_counter() - t
    plan = plan_merge(
        rule,
        run=ref.run,
        lease=ref.lease,
        head=head_row.number,
        epochs=cfg.run.epochs,
        max_staleness=cfg.merge.max_staleness,
        merged_in_epoch=merged_in(ledger, ref.run, attempts[0].epoch),
        candidates=[
            Candidate.of(a, attrs) for a, (_, _, attrs) in zip(attempts, opened, strict=True)
        ],
    )
    if isinstance(plan, Rejection):
        return None
    steps: list[Step] = []
    for attempt, step, (result, base, _) in zip(attempts, plan.steps, opened, strict=True):
        if base is None and rule.reads_base:
            t = time.perf_counter()
            try:
                base = base_of(ref, attempt, cache)
            except StoreError:
                return None
            timings["read_base"] = timings.get("read_base", 0.0) + time.perf_counter() - t
        steps.append(Step(result, step.blend, base if rule.reads_base else None))
    items = [FoldItem(s.attempt_id, s.alpha, s.staleness, s.path) for s in plan.steps]

    state = (
        cache.rule_state(head_row, lambda v: read_rule_state(ref, store, v))
        if rule.keeps_state
        else None
    )
    number, path, attrs = plan.number, plan.path, plan.attrs()
    t = time.perf_counter()
    spare = cache.take_spare(rule, head)
    try:
        streamed = streamed_fold(
            rule,
            head,
            steps,
            functools.partial(store.writer, path, specs_of(head), attrs),
            state=state,
            out=spare,
            mergers=cfg.merge.mergers,
        )
    except (IntegrityError, StoreNotFoundError):
        cache.give_back(spare)
        return None
    timings["merge"] = time.perf_counter() - t
    if streamed.applied is None:
        cache.give_back(spare)
        return None
    merged = streamed.applied
    assert streamed.checksum is not None

    t = time.perf_counter()
    state_path = rule_state_path(ref.run, path)
    if merged.state is not None:
        store.write_state(state_path, merged.state, attrs={"run": ref.run, "number": number})
    timings["write_version"] = time.perf_counter() - t

    t = time.perf_counter()
    try:
        versions = ledger.commit_fold(
            ref.run, items, expected_head=head_row.number, checksum=streamed.checksum
        )
    except FoldRefused:
        delete_groups(store, path, state_path if merged.state is not None else None)
        return None
    finally:
        timings["ledger"] = time.perf_counter() - t
    cache.put(number, merged.weights, owned=True)
    if rule.keeps_state:
        cache.put_rule_state(number, merged.state)
        store.delete(rule_state_path(ref.run, head_row.uri))
    for attempt in attempts:
        assert attempt.result_uri is not None  # checked above
        store.delete(attempt.result_uri)
    # Each result's share of the fold's time: what a merge costs per result.
    share = {k: v / len(attempts) for k, v in timings.items()}
    return [
        MergeOutcome(
            attempt.id,
            "merged",
            version=version.number,
            alpha=item.alpha,
            staleness=item.staleness,
            timings=dict(share),
        )
        for attempt, item, version in zip(attempts, items, versions, strict=True)
    ]

"""What an epoch tidies as it goes and at its barrier: late duplicates, checkpoints, versions.

Two calls of :class:`flows.epoch.EpochExecutor`, each an instruction of the
epoch's state machine carried out: :func:`settle_results` (``Settle``: results
that came in for subtasks merged from another attempt are recorded
``duplicate`` and deleted, those that came in for subtasks closed without a
merge (dropped, failed) ``rejected`` and deleted; checkpoints nothing will
resume are deleted, the pure decision being :func:`vcdl.driver.epoch_attempts.settle`) and
:func:`prune_versions` (``Prune``: the retention policy, ``store.keep``).
"""

from __future__ import annotations

import logging

from vcdl.config import RunConfig
from vcdl.driver.epoch_attempts import settle
from vcdl.driver.epoch_events import DropCheckpoint, RecordLate
from vcdl.driver.gc import collect
from vcdl.errors import StoreError
from vcdl.ledger import Ledger
from vcdl.ledger.pg import CLOSED_UNMERGED_END
from vcdl.runtime import RunRef
from vcdl.states import MERGEABLE_ATTEMPT_STATES
from vcdl.worker.attempt import drop_checkpoint


def settle_results(ref: RunRef, ledger: Ledger) -> int:
    """Record late duplicates and late results of subtasks closed without a merge, and
    delete checkpoints nothing resumes any more; the duplicates recorded."""
    store = ref.store()
    # Only attempts that may need settling (few at any time), and the
    # subtasks of their epochs: not every row of a long run at every barrier.
    candidates = {
        a.id: a
        for a in [
            *ledger.attempts(ref.run, states=MERGEABLE_ATTEMPT_STATES),
            *ledger.attempts(ref.run, checkpointed=True),
        ]
    }
    subtasks = [
        s
        for epoch in sorted({a.epoch for a in candidates.values()})
        for s in ledger.subtasks(ref.run, epoch)
    ]
    duplicates = 0
    for step in settle(candidates.values(), subtasks):
        if isinstance(step, DropCheckpoint):
            drop_checkpoint(ref, step.attempt_id)
            continue
        if isinstance(step, RecordLate):
            ledger.finish_attempt(
                step.attempt_id,
                state="rejected",
                reason=f"came in after its subtask was {step.subtask_state}{CLOSED_UNMERGED_END}",
            )
        else:
            ledger.finish_attempt(
                step.attempt_id, state="duplicate", reason="subtask merged from another attempt"
            )
            duplicates += 1
        if step.result_uri:
            store.delete(step.result_uri)
    return duplicates


def prune_versions(
    ref: RunRef, cfg: RunConfig, hold: frozenset[int], log: logging.Logger | logging.LoggerAdapter
) -> None:
    """Apply the retention policy (store.keep), keeping ``hold``. A store error leaves
    leftovers the next pass (or `vcdl gc`) deletes."""
    try:
        collect(ref, cfg, measure=False, hold=set(hold))
    except StoreError as exc:
        log.warning("retention pass failed (the next one retries): %s", exc)

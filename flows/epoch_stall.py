"""What an epoch waits for when no result has come back for a while: said in the log.

A drain that waits minutes without a result is slow work (big shards, a slow
link) or something stuck: a task Dask never starts, a worker hung before its
attempt claimed the subtask (no attempt row, so no deadline ever passes), a
done-callback that never reached the driver. The ledger alone cannot tell
these apart, and an operator (or a CI log) left with "it hung" cannot act.
After a quarter of ``fault.attempt_timeout`` without a result (225 s by
default; a job whose shards train long has a long timeout, so its ordinary
waits say nothing) the driver logs, per subtask in
flight, what Dask says of its task (its state and worker), the subtask's
attempts, and the task's call stack on its worker; then again after twice as
long, and so on (a stall of hours logs a handful of times, not every poll).

* :func:`stall_due` — when the next report is due. Pure.
* :func:`describe_stall` — the report's text. Pure.
* :func:`look_up_tasks` — Dask's side (scheduler state, call stacks), bounded
  in time; nothing in it may stop the epoch.
* :func:`check_stall` — what the executor (:class:`flows.epoch.EpochExecutor`)
  calls as it polls: when a report is due, it first takes what needs no
  report. A finished Dask future whose done-callback never came is handed
  over. A task whose attempt the ledger holds as a result, still not back,
  is stuck after its body (a Prefect hook, a Prefect API that does not
  answer): its result is merged from the ledger, as when a task's output
  cannot be fetched, and the task is cancelled. Only then the report.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flows.workarounds.task_runs import dask_key, runner_done
from vcdl.driver.epoch_events import AttemptFact, Key, recorded_return
from vcdl.states import MERGEABLE_ATTEMPT_STATES

if TYPE_CHECKING:
    from flows.epoch import EpochExecutor

log = logging.getLogger(__name__)

STALL_FRACTION = 0.25
"""Of ``fault.attempt_timeout``: seconds without a result, with subtasks in flight,
before the first report."""

LOOKUP_TIMEOUT = 10.0
"""Seconds the scheduler and workers get to answer a report's questions."""

STACK_LINES = 12
"""The innermost frames of a stalled task's call stack that a report shows."""

SHOWN_TASKS = 20
"""Tasks a report names one by one (those Dask runs first); the rest are counted by
their state in Dask: an epoch of a thousand shards waiting is not a thousand lines."""


def stall_due(quiet: float, reports: int, attempt_timeout: float) -> bool:
    """Whether a report is due after ``quiet`` seconds without a result, ``reports`` made
    (the first at :data:`STALL_FRACTION` of ``attempt_timeout``, each next one at twice
    the wait of the one before)."""
    return quiet >= STALL_FRACTION * attempt_timeout * 2**reports


@dataclass(frozen=True)
class TaskLook:
    """What Dask's scheduler says of one task: its state, the worker it runs on, its
    call stack there (innermost frames last)."""

    state: str
    worker: str | None = None
    stack: tuple[str, ...] = field(default=())


UNFOLLOWED = TaskLook("no task followed by the driver, though the epoch counts it in flight")
"""The look of a subtask the epoch's state has in flight with no task: a driver's bug."""


def _attempt_line(a: AttemptFact, now: datetime) -> str:
    since = f" for {(now - a.started_at).total_seconds():.0f} s" if a.started_at else ""
    where = f" on {a.worker}" if a.worker else ""
    return f"attempt {a.number} {a.state}{where}{since}"


def describe_stall(
    epoch: int,
    quiet: float,
    waiting: Sequence[tuple[Key, int, TaskLook | None, Sequence[AttemptFact]]],
    now: datetime | None = None,
    merging: Sequence[Key] = (),
) -> str:
    """The report: one paragraph per subtask in flight (key, submission number, Dask's
    look at its task or None when it could not be had, its attempts' rows), and the
    subtasks whose merge is not answered yet (``merging``)."""
    now = now or datetime.now(UTC)
    lines = [
        f"epoch {epoch}: no result for {quiet:.0f} s; waiting for {len(waiting)} "
        f"task{'s' if len(waiting) != 1 else ''}"
        + (f" and {len(merging)} merge{'s' if len(merging) != 1 else ''}" if merging else "")
        + ":"
    ]
    for (e, shard), number, look, attempts in waiting[:SHOWN_TASKS]:
        dask = "Dask: not asked" if look is None else f"Dask: {look.state}"
        if look is not None and look.worker:
            dask += f" on {look.worker}"
        rows = "; ".join(_attempt_line(a, now) for a in attempts) or "no attempt row yet"
        lines.append(f"  epoch {e} shard {shard}, submission {number}: {dask}; {rows}")
        if look is not None and look.stack:
            lines.extend(f"      {frame.rstrip()}" for frame in look.stack[-STACK_LINES:])
    rest = Counter(
        "not asked" if look is None else look.state for _, _, look, _ in waiting[SHOWN_TASKS:]
    )
    if rest:
        states = ", ".join(f"{n} {state}" for state, n in sorted(rest.items()))
        lines.append(f"  and {sum(rest.values())} more tasks ({states})")
    for e, shard in merging:
        lines.append(f"  epoch {e} shard {shard}: its merge not answered yet")
    if waiting and all(not a and look is not UNFOLLOWED for _, _, look, a in waiting):
        lines.append(
            "  No attempt has claimed its subtask: the tasks wait in Dask (a worker "
            "busy, gone or hung before its claim); the Dask dashboard shows them."
        )
    return "\n".join(lines)


def _scheduler_states(keys: list[Any], dask_scheduler: Any = None) -> dict[Any, tuple[str, Any]]:
    # Runs on the scheduler (Client.run_on_scheduler passes dask_scheduler).
    out: dict[Any, tuple[str, Any]] = {}
    for key in keys:
        ts = dask_scheduler.tasks.get(key)
        if ts is None:
            out[key] = ("unknown to the scheduler", None)
        else:
            on = ts.processing_on.address if ts.processing_on is not None else None
            out[key] = (ts.state, on)
    return out


def _frames(stack: object) -> tuple[str, ...]:
    if isinstance(stack, list | tuple):
        return tuple(str(line) for line in stack)
    return (str(stack),) if stack else ()


def look_up_tasks(client: Any, keys: Iterable[Any]) -> Mapping[Any, TaskLook]:
    """Dask's look at tasks by key: scheduler state and worker, the call stacks of
    those processing. Whatever cannot be had within :data:`LOOKUP_TIMEOUT` is left
    out (logged at DEBUG): a report is help, never a new way to fail."""
    keys = list(keys)
    if client is None or not keys:
        return {}
    try:
        states = client.run_on_scheduler(_scheduler_states, keys, callback_timeout=LOOKUP_TIMEOUT)
    except Exception as exc:  # the scheduler gone or slow: the report says less
        log.debug("a stall report could not ask the scheduler: %s", exc)
        return {}
    looks = {k: TaskLook(state, worker) for k, (state, worker) in states.items()}
    processing = [k for k, look in looks.items() if look.state == "processing"]
    if not processing:
        return looks
    try:
        stacks = client.sync(
            client.scheduler.call_stack, keys=processing, callback_timeout=LOOKUP_TIMEOUT
        )
    except Exception as exc:
        log.debug("a stall report could not read the workers' call stacks: %s", exc)
        return looks
    for per_worker in (stacks or {}).values():
        for key, stack in (per_worker or {}).items():
            if key in looks:
                old = looks[key]
                looks[key] = TaskLook(old.state, old.worker, _frames(stack))
    return looks


@dataclass
class StallWatch:
    """When a result last came back to the epoch, and the reports made since."""

    quiet_since: float = field(default_factory=time.monotonic)
    reports: int = 0

    def result_came(self, now: float) -> None:
        """A result came back (or the drain began) at ``now``: the quiet starts again."""
        self.quiet_since, self.reports = now, 0


def check_stall(ex: EpochExecutor, now: float) -> None:
    """What the epoch does after a stall report's wait without a result (the module's
    docstring): hand over what came back unseen, take results the ledger holds, else
    report."""
    watch = ex.stall
    quiet = now - watch.quiet_since
    if ex.state.finished or not stall_due(quiet, watch.reports, ex.cfg.fault.attempt_timeout):
        return
    watch.reports += 1
    lost = [f for f in ex.futures.values() if f in ex.tasks and runner_done(f)]
    for fut in lost:
        ex.log.warning(
            "epoch %d: a task Dask finished (%s) never reached the driver; taken now",
            ex.epoch,
            fut.task_run_id,
        )
        ex.done.put(fut)
    if lost or take_recorded(ex, quiet):
        return
    followed = {key: (n, dask_key(f)) for (key, n), f in ex.futures.items()}
    looks = look_up_tasks(ex.dask_client, [d for _, d in followed.values() if d is not None])
    flying: list[tuple[Key, int, TaskLook | None]] = []
    for key in sorted(ex.state.in_flight | set(followed)):
        number, task_key = followed.get(key, (0, None))
        flying.append((key, number, looks.get(task_key) if key in followed else UNFOLLOWED))
    # Those on a worker first: their stacks say the most.
    flying.sort(key=lambda item: item[2] is None or item[2].worker is None)
    waiting = [
        (key, number, look, ex.attempts_of(key) if i < SHOWN_TASKS else ())
        for i, (key, number, look) in enumerate(flying)
    ]
    ex.log.warning("%s", describe_stall(ex.epoch, quiet, waiting, merging=sorted(ex.state.merging)))


def take_recorded(ex: EpochExecutor, quiet: float) -> bool:
    """Merge from the ledger the results of tasks that have not come back; whether any.

    A worker records its attempt before its task returns, so a result in the
    ledger whose task is still out after ``quiet`` seconds is stuck after its
    body. It is handled as when a task's output cannot be fetched
    (:func:`~vcdl.driver.epoch_events.recorded_return`); the task is cancelled
    and, should it come back after all, ignored.
    """
    rows = ex.ledger.attempts(ex.ref.run, states=MERGEABLE_ATTEMPT_STATES)
    with_result = {(a.epoch, a.shard) for a in rows}
    taken = False
    for (key, number), fut in list(ex.futures.items()):
        if fut not in ex.tasks or key not in with_result:
            continue
        attempts = ex.attempts_of(key)
        ex.log.warning(
            "epoch %d shard %d: its attempt is in the ledger as a result but its task "
            "(submission %d) is not back after %.0f s; merging it from the ledger",
            *key,
            number,
            quiet,
        )
        ex.forget(key, number, "cancelled", "its result was taken from the ledger")
        ex.feed(recorded_return(key, attempts))
        taken = True
    return taken

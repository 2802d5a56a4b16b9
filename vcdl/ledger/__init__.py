"""The ledger: every fact about runs, subtasks, attempts, versions, evaluations, decisions.

SQLModel tables (:mod:`.models`, read back as detached rows by :mod:`.rows`),
the queries (:class:`.queries.Ledger` in :mod:`.queries`, built from :mod:`.base`,
:mod:`.runs`, :mod:`.work`, :mod:`.versions` and :mod:`.decisions`: the driver's
decisions about a subtask its attempts cannot show), the merge's at-most-once
step (:mod:`.merging`; SQLite's and PostgreSQL's paths in :mod:`.sqlite`,
:mod:`.pg`), the database plumbing (:mod:`.engine`, :mod:`.retry`,
:mod:`.pgsession`; a PostgreSQL commit lost on the way resolved by
:mod:`.outcome`), the driver lease's fencing of writes (:mod:`.fence`), the refusal of someone
else's database before anything is written to it (:mod:`.foreign`) and the
schema migrations (:mod:`.migrations`).
"""

from __future__ import annotations

from vcdl.ledger.engine import redact_url
from vcdl.ledger.models import Attempt, Decision, Evaluation, Run, Subtask, Version, utcnow
from vcdl.ledger.queries import HeadMoved, Ledger, attempt_timings
from vcdl.ledger.versions import evaluation_metrics

__all__ = [
    "Attempt",
    "Decision",
    "Evaluation",
    "HeadMoved",
    "Ledger",
    "Run",
    "Subtask",
    "Version",
    "attempt_timings",
    "evaluation_metrics",
    "redact_url",
    "utcnow",
]

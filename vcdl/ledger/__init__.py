"""The ledger: every fact about runs, subtasks, attempts, versions and evaluations.

SQLModel tables (:mod:`.models`, read back as detached rows by :mod:`.rows`),
the queries (:class:`.queries.Ledger` in :mod:`.queries`, built from :mod:`.base`,
:mod:`.runs`, :mod:`.work` and :mod:`.versions`), the merge's at-most-once
step (:mod:`.merging`; SQLite's and PostgreSQL's paths in :mod:`.sqlite`,
:mod:`.pg`), the database plumbing (:mod:`.engine`, :mod:`.retry`, :mod:`.pgsession`), the
driver lease's fencing of writes (:mod:`.fence`), the refusal of someone
else's database before anything is written to it (:mod:`.foreign`) and the
schema migrations (:mod:`.migrations`).
"""

from __future__ import annotations

from vcdl.ledger.engine import redact_url
from vcdl.ledger.models import Attempt, Evaluation, Run, Subtask, Version, utcnow
from vcdl.ledger.queries import HeadMoved, Ledger, attempt_timings
from vcdl.ledger.versions import evaluation_metrics

__all__ = [
    "Attempt",
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

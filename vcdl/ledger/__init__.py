"""The ledger: every fact about runs, subtasks, attempts, versions and evaluations.

SQLModel tables (:mod:`.models`), the queries (:class:`.queries.Ledger`), the
database plumbing (:mod:`.engine`), SQLite's and PostgreSQL's merge paths
(:mod:`.sqlite`, :mod:`.pg`) and the schema migrations (:mod:`.migrations`).
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

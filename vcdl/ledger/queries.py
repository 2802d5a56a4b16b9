"""The ledger: every fact about runs, subtasks, attempts, versions and evaluations.

:class:`Ledger` is the queries and transactions on the tables of
:mod:`vcdl.ledger.models` (re-exported here), on SQLite (one machine, the
default) and PostgreSQL (several machines), put together from one part per
kind of row: runs and the lease (:mod:`vcdl.ledger.runs`), versions and
evaluations (:mod:`vcdl.ledger.versions`), subtasks and attempts
(:mod:`vcdl.ledger.work`), the merge (:mod:`vcdl.ledger.merging`), the
driver's decisions about subtasks (:mod:`vcdl.ledger.decisions`), on what
they share (:mod:`vcdl.ledger.base`). Connections, pools, retries and the
schema migrations on open live in :mod:`vcdl.ledger.engine`. It enforces
the two rules the rest of vcdl relies on (docs/design.md §1):

* a subtask is merged at most once: :meth:`Ledger.commit_merge` checks under a
  row lock, and the unique constraint ``version(run, subtask_id)`` is the
  backstop when two mergers race anyway;
* the head moves only by compare-and-swap from the head the merge was computed
  on; a lost race is :class:`~vcdl.errors.HeadConflict`, which the caller
  answers by re-reading the head, merging again and retrying.

Every public method is one transaction and returns detached row objects (safe
to read after the call; changing them changes nothing in the ledger). The
queries are SQLAlchemy Core with ``RETURNING`` where it saves a round trip; on
PostgreSQL most calls are a single statement in autocommit mode. The merge
path (start_attempt, finish_attempt, head, commit_merge), which runs thousands
of times per epoch, is one statement per call there, run on psycopg directly
(:mod:`vcdl.ledger.pg`); SQLite runs it through SQLAlchemy
(:mod:`vcdl.ledger.sqlite`).
"""

from __future__ import annotations

from vcdl.ledger.base import attempt_timings
from vcdl.ledger.decisions import DecisionQueries
from vcdl.ledger.engine import redact_url
from vcdl.ledger.merging import HeadMoved, MergeQueries
from vcdl.ledger.models import (
    Attempt,
    Decision,
    Evaluation,
    Run,
    Subtask,
    Version,
)
from vcdl.ledger.runs import RunQueries
from vcdl.ledger.work import WorkQueries


class Ledger(RunQueries, WorkQueries, MergeQueries, DecisionQueries):
    """Runs, subtasks, attempts, versions and evaluations in one SQL database.

    ``url`` is an SQLAlchemy URL: ``sqlite:///path/ledger.db`` (the parent
    directory is created) or ``postgresql+psycopg://user:pw@host/db``
    (``postgresql://`` is taken to mean psycopg 3; pool settings in the query,
    see :mod:`vcdl.ledger.engine`). The schema is created or migrated to the
    newest revision on open; with ``create=False`` (read-only commands) a
    missing database or schema raises :class:`LedgerNotFound` instead, so a
    mistyped location is reported, not silently created empty.
    """


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
    "redact_url",
]

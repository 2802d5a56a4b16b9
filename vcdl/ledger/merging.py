"""The merge in the ledger: version ``expected + 1`` and the head, at most once per subtask.

One transaction (one statement on PostgreSQL, :mod:`vcdl.ledger.pg`; SQLite's
plain statements under its write lock, :mod:`vcdl.ledger.sqlite`): the
head's compare-and-swap, the new version row, the attempt and subtask
marked merged. A subtask merged before makes the attempt a duplicate
(:class:`~vcdl.errors.AlreadyMerged`); a head that moved on changes
nothing (:class:`HeadMoved`).

A fold (``merge.fold``, :meth:`MergeQueries.commit_fold`) records k merges
in one transaction: k versions, the head moved to the last, the k - 1
before it recorded as pruned under :data:`FOLDED_CHECKSUM` (their weights
were never stored; none was ever the head, so no attempt's base is one).
Anything that would make one of them go otherwise changes nothing
(:class:`FoldRefused`): the caller merges them one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from vcdl.errors import AlreadyMerged, HeadConflict, LedgerError
from vcdl.ledger import models
from vcdl.ledger.base import _HEAD_ROW, _PG_COMMIT_MERGE, _VER
from vcdl.ledger.models import (
    FOLDED_CHECKSUM,
    Version,
)
from vcdl.ledger.pg import (
    COMMIT_MERGE_FIELDS,
)
from vcdl.ledger.rows import load
from vcdl.ledger.sqlite import (
    MERGE_SOURCES,
    MergeRow,
    commit_merge_row,
    mark_duplicate,
)
from vcdl.ledger.versions import VersionQueries
from vcdl.states import (
    MERGEABLE_ATTEMPT_STATES,
    check_attempt_move,
    check_subtask_move,
)


class HeadMoved(HeadConflict):
    """The :class:`HeadConflict` of a merge onto a head that had moved on.

    ``head`` is the head :meth:`Ledger.commit_merge` found: merge onto it and
    retry, without reading the head again.
    """

    def __init__(self, message: str, head: Version) -> None:
        super().__init__(message)
        self.head = head

    def __reduce__(self) -> tuple[type[HeadMoved], tuple[str, Version]]:
        # Exceptions cross process boundaries (Dask, Prefect) by pickle.
        return type(self), (str(self), self.head)


class FoldRefused(HeadConflict):
    """:meth:`MergeQueries.commit_fold` changed nothing: one of the merges could not go as
    planned (the head moved, a subtask was merged meanwhile, an attempt's state forbids
    it). Merge the results one at a time: each then ends as it would alone."""


@dataclass(frozen=True)
class FoldItem:
    """One merge of a fold, in order: the attempt, its α and staleness, and where its
    version's group is (or would have been: only the last one's is written)."""

    attempt_id: str
    alpha: float
    staleness: int
    uri: str


class _LostRace(Exception):
    """Internal: the version insert hit a unique constraint inside commit_merge."""


def _merge_row(row: tuple[Any, ...] | None) -> MergeRow | None:
    """The :class:`MergeRow` of a row of the PostgreSQL merge statement."""
    if row is None:
        return None
    fields, head = row[:COMMIT_MERGE_FIELDS], row[COMMIT_MERGE_FIELDS:]
    run, subtask_id, epoch, state, subtask_state, merged_version, version_id = fields
    return MergeRow(
        run,
        subtask_id,
        epoch,
        state,
        subtask_state,
        merged_version,
        version_id,
        None if head[0] is None else _HEAD_ROW.load(head),
    )


def _version(row: MergeRow, params: dict[str, Any], pruned: bool = False) -> Version:
    """The version a merge statement made: its row's ids and the statement's ``params``
    (run, expected, new, now, attempt_id, alpha, staleness, uri, checksum)."""
    now = params["now"]
    return load(
        Version,
        {"id": row.version_id, "run": params["run"], "number": params["new"]}
        | {"parent": params["expected"], "subtask_id": row.subtask_id, "epoch": row.epoch}
        | {k: params[k] for k in ("attempt_id", "alpha", "staleness", "uri", "checksum")}
        | {"created_at": now, "pruned_at": now if pruned else None},
    )


class MergeQueries(VersionQueries):
    """The merge."""

    def commit_merge(
        self,
        name: str,
        attempt_id: str,
        *,
        expected_head: int,
        uri: str,
        checksum: str,
        alpha: float,
        staleness: int,
    ) -> Version:
        """Make the attempt's merged weights version ``expected_head + 1`` and the head.

        One transaction, safe to repeat: the same merge (attempt, ``uri``,
        ``checksum``) found already committed returns its version. Raises
        :class:`AlreadyMerged` (after marking the attempt "duplicate") if the
        subtask has another merged version, and
        :class:`HeadConflict` (changing nothing) if the head is no longer
        ``expected_head``: merge onto the current head and call again. That
        head comes with the error when it is known (:class:`HeadMoved`), so
        the retry need not read it again.
        """
        new, now = expected_head + 1, models.utcnow()
        params = {
            "attempt_id": attempt_id,
            "run": name,
            "expected": expected_head,
            "new": new,
            "now": now,
            "alpha": alpha,
            "staleness": staleness,
            "uri": uri,
            "checksum": checksum,
        }

        def outcome(
            row: MergeRow | None, read_head: Callable[[], Version]
        ) -> Version | tuple[int, str]:
            if row is None:
                raise LedgerError(f"no attempt {attempt_id!r} in ledger {self._display}")
            if row.run != name:
                raise LedgerError(f"attempt {attempt_id} belongs to run {row.run!r}, not {name!r}")
            if row.merged_version is not None:
                return row.merged_version, row.state  # AlreadyMerged, below
            if row.version_id is None and row.state not in MERGEABLE_ATTEMPT_STATES:
                check_attempt_move(row.state, "merged", f"attempt {attempt_id}")
            if row.version_id is None and row.subtask_state not in MERGE_SOURCES:
                what = f"subtask epoch {row.epoch} of attempt {attempt_id}"
                check_subtask_move(row.subtask_state, "merged", what)
            if row.version_id is None:
                # The head as it is now: as the statement saw it, or a new read.
                head = row.head or read_head()
                raise HeadMoved(
                    f"head of run {name!r} is v{head.number}, not v{expected_head}: "
                    "merge onto that head and retry",
                    head,
                )
            return _version(row, params)

        def conflict() -> LedgerError:
            return HeadConflict(
                f"run {name!r}: concurrent merges collided (serialization failure); "
                "re-read the head, merge onto it and retry"
            )

        def tx(c: Connection) -> Version | tuple[int, str]:
            try:
                row = commit_merge_row(c, params)
            except IntegrityError as exc:
                raise _LostRace() from exc
            return outcome(row, lambda: self._head(c, name))

        try:
            if self._pg is None:
                result = self._db.single(tx, on_transient=conflict)
            else:
                try:
                    pg_row = self._pg.fetch_one(
                        _PG_COMMIT_MERGE, params, on_transient=conflict, repeatable=True
                    )
                except IntegrityError as exc:
                    raise _LostRace() from exc
                result = outcome(_merge_row(pg_row), lambda: self.head(name))
        except _LostRace as race:
            merged = self._after_lost_race(attempt_id)
            if merged is None:
                raise LedgerError(
                    f"merge of attempt {attempt_id} into run {name!r} as v{new} violated a "
                    f"constraint other than at-most-once: {race.__cause__}"
                ) from race
            result = merged
        if isinstance(result, tuple):
            number, state = result
            if state == "merged":
                # This very merge, committed by an earlier try whose answer the
                # network lost (the fast path repeats it: vcdl/ledger/retry.py):
                # done, not a duplicate, whose caller would delete the version's group.
                mine = self.get_version(name, number)
                if (mine.uri, mine.checksum) == (uri, checksum):
                    return mine
            what = "it was this attempt" if state == "merged" else "attempt recorded as duplicate"
            raise AlreadyMerged(
                f"subtask of attempt {attempt_id} (run {name!r}) is already merged as "
                f"v{number}; {what}, nothing merged again"
            )
        return result

    def commit_fold(
        self, name: str, items: Sequence[FoldItem], *, expected_head: int, checksum: str
    ) -> list[Version]:
        """Record ``items`` as versions ``expected_head + 1 ..`` in order, in one transaction.

        The head moves to the last, whose group is written with ``checksum``;
        the others are recorded as pruned under :data:`FOLDED_CHECKSUM`.
        Raises :class:`FoldRefused` (changing nothing) if any merge would not
        go as planned: the caller merges the results one at a time.
        """
        if not items:
            raise ValueError("commit_fold needs at least one merge")
        now = models.utcnow()
        last = len(items) - 1

        def tx(c: Connection) -> list[Version]:
            made: list[Version] = []
            for i, item in enumerate(items):
                expected = expected_head + i
                params = {
                    "attempt_id": item.attempt_id,
                    "run": name,
                    "expected": expected,
                    "new": expected + 1,
                    "now": now,
                    "alpha": item.alpha,
                    "staleness": item.staleness,
                    "uri": item.uri,
                    "checksum": checksum if i == last else FOLDED_CHECKSUM,
                }
                try:
                    row = commit_merge_row(c, params)
                except IntegrityError as exc:
                    raise FoldRefused(f"run {name!r}: fold refused: {exc}") from exc
                if row is None or row.run != name or row.version_id is None:
                    # Rolled back whole (raised inside the transaction).
                    raise FoldRefused(
                        f"run {name!r}: attempt {item.attempt_id} cannot be merged as "
                        f"v{expected + 1} in a fold; merge the results one at a time"
                    )
                made.append(_version(row, params, pruned=i < last))
            if last > 0:
                c.execute(
                    update(_VER)
                    .where(_VER.c.run == name, _VER.c.id.in_([v.id for v in made[:last]]))
                    .values(pruned_at=now)
                )
            return made

        def conflict() -> LedgerError:
            return FoldRefused(f"run {name!r}: a concurrent merge collided with a fold")

        return self._db.write(tx, on_transient=conflict)

    def _after_lost_race(self, attempt_id: str) -> tuple[int, str] | None:
        """After a unique violation: mark the attempt duplicate if its subtask has a version.

        Returns that version's number and the attempt's state, or None when the
        violation was something else.
        """

        def tx(c: Connection) -> tuple[int, str] | None:
            attempt = self._get_attempt(c, attempt_id)
            number = c.execute(
                select(_VER.c.number).where(
                    _VER.c.run == attempt.run, _VER.c.subtask_id == attempt.subtask_id
                )
            ).scalar()
            if number is None:
                return None
            return number, mark_duplicate(c, attempt_id, attempt.state, number, models.utcnow())

        return self._db.write(tx)

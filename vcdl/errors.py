"""vcdl's exception hierarchy.

One base, :class:`VcdlError`; every subclass also inherits the builtin it
resembles (as zarr-python's ``errors.py`` does), so ``except ValueError`` in a
caller's code keeps working. ``exit_code`` is what the CLI exits with: 2 for
bad input that the user must fix, 1 for failures at run time.
Messages say what was wrong and what to do.
"""

from __future__ import annotations


class VcdlError(Exception):
    """Base of every error vcdl raises on purpose."""

    exit_code: int = 1


class ConfigError(VcdlError, ValueError):
    """The run configuration is invalid (unknown key, wrong type, out of range)."""

    exit_code = 2


class DataError(VcdlError, ValueError):
    """A data set is missing, malformed or does not fit the run."""

    exit_code = 2


class ModelError(VcdlError, ValueError):
    """A model factory cannot be found, imported or called."""

    exit_code = 2


class StoreError(VcdlError, OSError):
    """The weight store cannot be read or written."""


class StoreConfigError(StoreError, ValueError):
    """The store's URL or options cannot work: unknown protocol, driver not installed."""

    exit_code = 2


class StoreNotFoundError(StoreError, FileNotFoundError):
    """A group (version, result, data set) is not in the store or is incomplete."""


class IntegrityError(StoreError):
    """Stored bytes do not match their recorded checksum, or a group is torn."""


class ChecksumMismatch(IntegrityError):
    """A group's recorded checksums are not those the ledger recorded for it.

    The group was rewritten after the ledger named it (its own checksums may
    well match its bytes): its contents are not the version the run made.
    Exit code 2: nothing vcdl can do; restore the group or use another version.
    """

    exit_code = 2


class MergeError(VcdlError, ValueError):
    """Two state dicts cannot be merged (keys, shapes or dtypes differ; bad alpha)."""


class ResultRejected(VcdlError, ValueError):
    """A worker's result failed validation (NaN/Inf, wrong keys/shapes, absurd norm)."""


class LedgerError(VcdlError, RuntimeError):
    """The ledger refused an operation or is inconsistent."""


class RunNotFound(LedgerError, LookupError):
    """No run of that name in the ledger."""

    exit_code = 2


class VersionNotFound(LedgerError, LookupError):
    """The run has no version of that number."""

    exit_code = 2


class VersionPruned(LedgerError, LookupError):
    """The version's weights were let go by the retention policy (its row stays)."""

    exit_code = 2


class SubtaskNotFound(LedgerError, LookupError):
    """The run has no such epoch or shard (``vcdl story``); the message names those it has."""

    exit_code = 2


class UnsupportedLedger(LedgerError, ValueError):
    """The ledger URL names a database vcdl does not run on."""

    exit_code = 2


class LedgerNotFound(LedgerError, LookupError):
    """No ledger where one was expected: no database file, or one without vcdl's tables."""

    exit_code = 2


class NotALedger(LedgerError, ValueError):
    """The database is not a vcdl ledger vcdl can use: not a database at all, someone
    else's tables, or vcdl's tables at a schema revision it cannot tell or does not know."""

    exit_code = 2


class HeadConflict(LedgerError):
    """The head moved between reading it and the compare-and-swap; retry."""


class AlreadyMerged(LedgerError):
    """The subtask already has a merged version: this attempt is a duplicate."""


class LeaseHeld(LedgerError):
    """Another driver process holds the run's lease."""


class RunBeingDriven(LeaseHeld):
    """A live driver holds the run's lease: a second ``vcdl train``/``resume`` of it is
    refused before it starts anything (exit 2: wait, or stop the other driver)."""

    exit_code = 2


class LeaseLost(LedgerError):
    """This driver's lease generation is no longer the run's: another driver took over.

    Raised by every ledger write of a fenced ledger (vcdl/ledger/fence.py)
    once the run's lease has passed on; the driver must stop at once.
    """


class DiskFull(VcdlError, OSError):
    """A disk (or a quota) ran out under the store, the ledger or a log (vcdl/diskfull.py).

    Exit code 2: nothing vcdl can retry; free space, or give it another disk.
    """

    exit_code = 2


class ClusterUnreachable(VcdlError, ConnectionError):
    """No Dask scheduler answered at the configured ``cluster.address``."""


class EpochFailed(VcdlError, RuntimeError):
    """No shard of an epoch could be merged: every attempt failed or was rejected."""

"""The weight store: state dicts as Zarr v3 groups, on a local disk or S3.

This module owns the store's public face: every tensor vcdl keeps (model
versions, attempt results) is written and read through a
:class:`WeightStore`, which also gives other modules raw Zarr access for data
sets. One :class:`WeightStore` wraps one root URL: a local directory (plain
path or ``file://``), ``s3://bucket/prefix`` through s3fs, or any other
fsspec URL. The same code serves all of them: the layout (which bytes go
where, the checksums, the documents) is :mod:`vcdl.store.layout`'s, and every
call to the backend is :mod:`vcdl.store.groups`'s, where only the byte
transport differs (local chunk files are written and read in place by
:mod:`vcdl.store.files`; other stores go through Zarr's store API). Groups of
the older format 1 are read by :mod:`vcdl.store.legacy`; a group read or
written a few tensors at a time is :mod:`vcdl.store.streaming`'s.

A state group is format 2 (see :mod:`vcdl.store.layout`): the tensors of
each dtype packed into one flat, uncompressed Zarr v3 array chunked at about
4 MiB, per-tensor offsets and SHA-256 checksums in the group's attributes,
every array's metadata consolidated into the group's ``zarr.json``. Plain
``zarr.open_group`` reads it.

Crash safety: the group's ``zarr.json`` is written exactly once, after every
array, and it is both the completion marker and the consolidated metadata. A
crash before it leaves a directory without group metadata, an *orphan*: it is
listed by :meth:`WeightStore.list` but readers report it as not found.
Overwriting or deleting a group removes its ``zarr.json`` first, so a crash
half-way through the removal also leaves an orphan, never a torn group that
claims to be complete. Two writers racing on one path can still interleave;
``read_state(verify=True)`` then fails with :class:`IntegrityError` (paths
are meant to be unique per attempt and per version, so this is a bug signal).

Writing: chunk writes and per-tensor hashing run together in worker threads
(hashlib and the file system calls release the GIL); the group document is
written when both are done. Reading: every chunk is read straight into the
memory of the tensors it holds (each tensor owns its memory, nothing is
shared between tensors), then every tensor is hashed and compared, again in
worker threads. ResNet-50 (98 MiB, 320 tensors) measured here: see
``benchmarks/weights_io.py``. Uses ``zarr.core`` internals (metadata classes,
the sync loop); zarr is pinned below 3.2 for that reason among others.

Errors: backend failures become :class:`StoreError` saying what to check; a
missing bucket is named as such, never reported as a missing group. Transient
S3 errors are retried by s3fs itself (``retries`` in ``storage_options``).

Nothing here unpickles: tensors are rebuilt from raw bytes, dtype and shape.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import Mapping, Sequence
from typing import Any, cast

import zarr
import zarr.errors
from zarr.core.common import AccessModeLiteral

from vcdl.errors import IntegrityError, StoreError, StoreNotFoundError, VcdlError
from vcdl.redact import redact_url
from vcdl.store.backend import concurrency, in_threads
from vcdl.store.groups import Groups
from vcdl.store.layout import (
    ATTR,
    CHECKSUM_ALGORITHM,
    FORMAT,
    READABLE_FORMATS,
    WritePlan,
    check_identity,
    combined_checksum,
    consolidated_of,
    digest,
    is_complete,
    json_attrs,
    plan_read,
    plan_write,
)
from vcdl.store.legacy import read_v1
from vcdl.store.streaming import StateReader, StateWriter, TensorSpec
from vcdl.types import StateDict

__all__ = ["CHECKSUM_ALGORITHM", "FORMAT", "READABLE_FORMATS", "WeightStore", "open_store"]


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> WeightStore:
    """Open the weight store at ``url``; see :class:`WeightStore`."""
    return WeightStore(url, storage_options)


class WeightStore:
    """State dicts and raw Zarr groups under one root URL.

    ``url`` is a local directory (relative, absolute or ``file://``; created
    on the first write), ``s3://bucket/prefix`` or any fsspec URL.
    ``storage_options`` go to fsspec (for S3: ``endpoint_url``, ``key``,
    ``secret``, ``client_kwargs``, ``retries``...; s3fs retries transient S3
    errors itself). Paths given to the methods are ``/``-separated, relative
    to the root; a full URI inside this store (as :meth:`uri` returns) is
    accepted too. Constructing a store does no I/O.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self._groups = Groups(url, storage_options)

    def __repr__(self) -> str:
        return f"WeightStore({redact_url(self.url)!r})"

    @property
    def url(self) -> str:
        """The normalized root: an absolute directory, or ``scheme://bucket/prefix``."""
        return self._groups.url

    def uri(self, path: str) -> str:
        """Full URI of ``path`` in this store (the root itself for ``""``)."""
        return self._groups.uri(path)

    def shown(self, path: str = "") -> str:
        """:meth:`uri` as messages and logs show it: through :func:`~vcdl.redact.redact_url`."""
        return self._groups.shown(path)

    # ---------------------------------------------------------------- writing

    def write_state(
        self, path: str, state: StateDict, attrs: Mapping[str, Any] | None = None
    ) -> str:
        """Write ``state`` as a complete group at ``path``; return its URI.

        An existing state group at ``path`` (complete or orphaned) is replaced.
        Any other Zarr node there (a parent of other groups, a data set) is
        refused rather than wiped. ``attrs`` must survive a JSON round trip
        (tuples come back as lists).
        """
        groups = self._groups
        rel = groups.rel(path)
        uri = groups.shown(rel)  # for messages; the real URI is returned
        user_attrs = json_attrs(attrs, uri)
        plan = plan_write(state, uri)
        groups.run(self._write(rel, uri, plan, user_attrs), "writing", uri)
        return groups.uri(rel)

    async def _write(self, rel: str, uri: str, plan: WritePlan, user_attrs: dict[str, Any]) -> None:
        groups = self._groups
        metas = {node: a.meta()[1] for node, a in plan.arrays.items()}
        await groups.begin(rel, uri, metas, "write_state")
        chunks = [(f"{a.node}/{a.chunk_key(j)}", views) for a, j, views in plan.chunk_views()]
        tensors = plan.tensors
        jobs = [
            functools.partial(_digests, [tensors[i].data for i in job]) for job in plan.hash_jobs()
        ]
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(groups.put_chunks(rel, chunks))
            hashing = tasks.create_task(in_threads(jobs))
        checksums = [d for batch in hashing.result() for d in batch]
        await self._publish(rel, plan.group_doc(checksums, user_attrs))

    async def _publish(self, rel: str, doc: bytes) -> None:
        """The commit point of :meth:`write_state` (the tests' crash point)."""
        await self._groups.publish(rel, doc)

    def delete(self, path: str) -> None:
        """Remove the group at ``path``, complete or not; absent is fine."""
        groups = self._groups
        rel = groups.rel(path)
        groups.run(groups.delete(rel), "deleting", groups.shown(rel))

    # ---------------------------------------------------------------- reading

    def read_state(self, path: str, verify: bool = True, expect: str | None = None) -> StateDict:
        """The state dict at ``path``: CPU tensors, original names, order and dtypes.

        Every tensor owns its memory (writable, shared with no other tensor).
        Raises :class:`StoreNotFoundError` if the group is missing or
        incomplete, and :class:`IntegrityError` if its record table is
        malformed or a tensor is missing, truncated or (with ``verify``) does
        not match its checksum. ``expect``: the group's content identity as
        the ledger recorded it (:func:`~vcdl.store.layout.combined_checksum`);
        a group whose records hash otherwise is refused with
        :class:`ChecksumMismatch` before anything is read, so the bytes are
        verified against the ledger's checksums, not only the group's own.
        """
        groups = self._groups
        rel = groups.rel(path)
        uri = groups.shown(rel)
        return groups.run(self._read(rel, uri, verify, expect), "reading", uri)

    def reader(self, path: str, verify: bool = True, expect: str | None = None) -> StateReader:
        """The complete state group at ``path``, to read a few tensors at a time
        (``expect``: as for :meth:`read_state`)."""
        return StateReader(self._groups, path, verify, expect)

    def writer(
        self, path: str, specs: Sequence[TensorSpec], attrs: Mapping[str, Any] | None = None
    ) -> StateWriter:
        """A state group at ``path`` to write a few tensors at a time (replacing one there)."""
        return StateWriter(self._groups, path, specs, attrs)

    async def _read(self, rel: str, uri: str, verify: bool, expect: str | None) -> StateDict:
        groups = self._groups
        group = await groups.complete_doc(rel, uri)
        vcdl = group["attributes"][ATTR]
        if expect is not None:
            check_identity(vcdl, expect, uri)
        if vcdl.get("format") == 1:
            return await read_v1(groups.reader, groups.url, rel, uri, group, verify, concurrency())
        meta = consolidated_of(group, uri)
        plan = await asyncio.to_thread(plan_read, vcdl, meta, uri)
        return await groups.read_tensors(rel, uri, plan, verify)

    def read_attrs(self, path: str) -> dict[str, Any]:
        """The ``attrs`` given to :meth:`write_state` for the complete group at ``path``."""
        groups = self._groups
        rel = groups.rel(path)
        uri = groups.shown(rel)
        group = groups.run(groups.complete_doc(rel, uri), "reading", uri)
        return dict(group["attributes"][ATTR].get("attrs") or {})

    def checksum(self, path: str) -> str:
        """One SHA-256 over the group's tensors (name, dtype, shape, checksum; by name).

        It is computed from the recorded metadata, not by reading the data;
        ``read_state(verify=True)`` checks the data against the same records.
        """
        groups = self._groups
        rel = groups.rel(path)
        uri = groups.shown(rel)
        group = groups.run(groups.complete_doc(rel, uri), "reading", uri)
        tensors = group["attributes"][ATTR]["tensors"]
        if not isinstance(tensors, dict):
            raise IntegrityError(f"{uri}: the group records no tensors")
        return combined_checksum(tensors)

    def exists(self, path: str) -> bool:
        """True if a complete state group is at ``path``."""
        groups = self._groups
        rel = groups.rel(path)
        uri = groups.shown(rel)

        async def exists() -> bool:
            doc = await groups.doc(rel)
            if doc is not None and is_complete(doc):
                return True
            await groups.check_bucket()
            return False

        return groups.run(exists(), "reading", uri)

    def nbytes(self, path: str = "") -> int:
        """Bytes of every object under ``path`` (the whole store for ``""``); 0 if none.

        What the store holds on disk or in the bucket, metadata included:
        what retention frees and what a user pays for.
        """
        groups = self._groups
        rel = groups.rel(path, allow_root=True)
        return groups.run(groups.nbytes(rel), "measuring", groups.uri(rel))

    def list(self, prefix: str) -> builtins.list[str]:
        """Sorted names of the nodes directly under ``prefix`` (complete or not).

        Under a prefix such as ``runs/r1/versions`` these are the state groups;
        orphans from crashes are included so they can be cleaned up. ``[]`` if
        the prefix does not exist.
        """
        groups = self._groups
        rel = groups.rel(prefix, allow_root=True)
        return sorted(groups.run(groups.names(rel), "listing", groups.shown(rel)))

    def open_group(self, path: str, mode: str = "r") -> zarr.Group:
        """The raw Zarr group at ``path`` (``mode`` as for :func:`zarr.open_group`).

        For data sets and other plain arrays; state groups are for
        :meth:`write_state` / :meth:`read_state`. Mode ``"r"`` opens through a
        read-only store.
        """
        groups = self._groups
        rel = groups.rel(path, allow_root=True)
        uri = groups.shown(rel)
        if not rel and mode == "w":
            raise StoreError(f"open_group('', mode='w') would erase the whole store {uri}")
        store = groups.reader if mode == "r" else groups.store

        try:
            return zarr.open_group(store, path=rel, mode=cast(AccessModeLiteral, mode))
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError) as exc:
            if mode in ("r", "r+"):
                groups.run(groups.check_bucket(), "opening", uri)
                raise StoreNotFoundError(f"no Zarr group at {uri}") from exc
            raise groups.backend_error(exc, "opening", uri) from exc
        except VcdlError:
            raise
        except Exception as exc:
            raise groups.backend_error(exc, "opening", uri) from exc


def _digests(views: builtins.list[memoryview]) -> builtins.list[str]:
    return [digest(v) for v in views]

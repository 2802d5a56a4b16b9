"""The weight store: state dicts as Zarr v3 groups, on a local disk or S3.

Longer than ~500 lines on purpose: one class is the store's only I/O path on
every backend, and its write and read halves share the concurrency, the
commit order and the error handling that make a group crash-safe.

This module owns the I/O of every tensor vcdl keeps (model versions, attempt
results) and the raw Zarr access other modules use for data sets. One
:class:`WeightStore` wraps one root URL: a local directory (plain path or
``file://``), ``s3://bucket/prefix`` through s3fs, or any other fsspec URL.
The same code serves all of them: the layout (which bytes go where, the
checksums, the documents) is :mod:`vcdl.store.layout`'s, and only the byte
transport differs (local chunk files are written and read in place by
:mod:`vcdl.store.files`; other stores go through Zarr's store API). Groups of
the older format 1 are read by :mod:`vcdl.store.legacy`.

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
import contextlib
import json
import os
import re
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar, cast

import zarr
import zarr.errors
from zarr.core.common import AccessModeLiteral
from zarr.core.sync import _get_loop as _zarr_loop
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from vcdl.errors import (
    IntegrityError,
    StoreConfigError,
    StoreError,
    StoreNotFoundError,
    VcdlError,
)
from vcdl.redact import redact_text, redact_url
from vcdl.store import files as store_files
from vcdl.store.arrays import GROUP_DOC, PROTOTYPE
from vcdl.store.layout import (
    ATTR,
    CHECKSUM_ALGORITHM,
    EMPTY_GROUP_DOC,
    FORMAT,
    READABLE_FORMATS,
    CheckedTable,
    ChunkRead,
    ReadPlan,
    WritePlan,
    buffer,
    check_identity,
    combined_checksum,
    consolidated_of,
    digest,
    is_complete,
    is_state_doc,
    json_attrs,
    parents,
    plan_read,
    plan_write,
    verify,
)
from vcdl.store.legacy import read_v1
from vcdl.store.streaming import StateReader, StateWriter, TensorSpec
from vcdl.types import StateDict

__all__ = ["CHECKSUM_ALGORITHM", "FORMAT", "READABLE_FORMATS", "WeightStore", "open_store"]

_T = TypeVar("_T")

# Protocols whose first path component is a bucket that must exist.
_BUCKET_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}


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
        if isinstance(url, os.PathLike):
            url = os.fspath(url)
        if not isinstance(url, str) or not url:
            raise StoreError(f"store url must be a non-empty string, got {url!r}")
        self._options = dict(storage_options or {})
        self._bucket_checked = False
        self._parents_known: set[str] = set()
        if "://" not in url or url.startswith("file://"):
            local = url.removeprefix("file://")
            self._url = os.path.abspath(os.path.expanduser(local))
            self._protocol = "file"
            self._store: LocalStore | FsspecStore = LocalStore(self._url)
        else:
            self._protocol, location = url.split("://", 1)
            if not location.strip("/"):
                # "s3://" with its bucket left out: stripped to "s3:", fsspec
                # takes it for a local directory named "s3:" and the run's
                # weights would go to this machine's disk.
                raise StoreConfigError(
                    f"store url {redact_url(url)!r} names nothing after {self._protocol}://; "
                    "give the location after it, e.g. s3://bucket/prefix"
                )
            self._url = url.rstrip("/")
            # A private fs instance: fsspec's instance cache would hand our
            # loop-bound async s3fs client to other code (docs/stack.md).
            options = {"skip_instance_cache": True, **self._options}
            if self._protocol in ("s3", "s3a"):
                # Each tensor is one GET already, fetched concurrently; s3fs's
                # default (max_concurrency > 1) adds a HEAD per GET to plan
                # ranged reads, which doubled read time on the S3 endpoint here.
                options.setdefault("max_concurrency", 1)
            try:
                self._store = FsspecStore.from_url(self._url, storage_options=options)
            except (ValueError, TypeError, ImportError) as exc:
                # An unknown protocol, a driver not installed, a bad option: the
                # config's mistake (exit 2), not the store's.
                raise StoreConfigError(
                    f"cannot open store {redact_url(self._url)!r}: {type(exc).__name__}: "
                    f"{redact_text(str(exc))}; "
                    "check store.url and store.storage_options"
                ) from exc
            except Exception as exc:
                raise StoreError(
                    f"cannot open store {redact_url(self._url)!r}: {type(exc).__name__}: "
                    f"{redact_text(str(exc))}; "
                    "check store.url and store.storage_options"
                ) from exc
        # Reads go through a read-only twin: a typo in a reader can never write.
        self._reader = self._store.with_read_only(True)
        if isinstance(self._store, FsspecStore):
            # An asynchronous s3fs leaves closing its HTTP session to its owner;
            # without this every store leaks one until exit ("Unclosed client
            # session").
            weakref.finalize(self, _close_session, self._store.fs)

    def __repr__(self) -> str:
        return f"WeightStore({redact_url(self._url)!r})"

    @property
    def url(self) -> str:
        """The normalized root: an absolute directory, or ``scheme://bucket/prefix``."""
        return self._url

    def uri(self, path: str) -> str:
        """Full URI of ``path`` in this store (the root itself for ``""``)."""
        rel = self._rel(path, allow_root=True)
        return f"{self._url}/{rel}" if rel else self._url

    def shown(self, path: str = "") -> str:
        """:meth:`uri` as messages and logs show it: through :func:`~vcdl.redact.redact_url`."""
        return redact_url(self.uri(path))

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
        rel = self._rel(path)
        uri = self.shown(rel)  # for messages; the real URI is returned
        user_attrs = json_attrs(attrs, uri)
        plan = plan_write(state, uri)
        self._run(self._write(rel, uri, plan, user_attrs), "writing", uri)
        return self.uri(rel)

    async def _write(self, rel: str, uri: str, plan: WritePlan, user_attrs: dict[str, Any]) -> None:
        existing = await self._get_doc(rel)
        if existing is not None and not is_state_doc(existing):
            raise StoreError(
                f"{uri} holds a Zarr {existing.get('node_type', 'node')} that write_state did "
                "not write; refusing to overwrite it (delete it first if that is intended)"
            )
        # Unpublish first, then clear: a crash in between leaves an orphan.
        await self._store.delete(f"{rel}/{GROUP_DOC}")
        await self._store.delete_dir(rel)

        semaphore = asyncio.Semaphore(_concurrency())
        local = isinstance(self._store, LocalStore)
        metas = {node: a.meta()[1] for node, a in plan.arrays.items()}

        async def put(key: str, data: bytes | memoryview) -> None:
            async with semaphore:
                await self._store.set(key, PROTOTYPE.buffer.from_bytes(data))

        async def write_chunks() -> None:
            chunks = plan.chunk_views()
            if local:
                root = os.path.join(self._url, rel)

                def write_metas() -> None:
                    for node, meta in metas.items():
                        store_files.write_file(os.path.join(root, node, GROUP_DOC), meta)

                # The array directories must exist before their chunks are written.
                await asyncio.to_thread(write_metas)
                await _in_threads(
                    [
                        _bind(
                            store_files.write_chunk, os.path.join(root, a.node, a.chunk_key(j)), v
                        )
                        for a, j, v in chunks
                    ]
                )
                return
            async with asyncio.TaskGroup() as tasks:
                for node, meta in metas.items():
                    tasks.create_task(put(f"{rel}/{node}/{GROUP_DOC}", meta))
                for a, j, views in chunks:
                    data = views[0] if len(views) == 1 else b"".join(views)
                    tasks.create_task(put(f"{rel}/{a.node}/{a.chunk_key(j)}", data))

        async def hash_all() -> list[str]:
            tensors = plan.tensors
            jobs = [_bind(_digests, [tensors[i].data for i in job]) for job in plan.hash_jobs()]
            return [d for batch in await _in_threads(jobs) for d in batch]

        async with asyncio.TaskGroup() as tasks:
            for parent in parents(rel):
                if parent not in self._parents_known:
                    tasks.create_task(self._ensure_parent(parent))
            tasks.create_task(write_chunks())
            hashing = tasks.create_task(hash_all())
        await self._publish(rel, plan.group_doc(hashing.result(), user_attrs))

    async def _publish(self, rel: str, doc: bytes) -> None:
        """The commit point: write the group's metadata, the last write of a group."""
        await self._store.set(f"{rel}/{GROUP_DOC}", buffer(doc))

    async def _ensure_parent(self, parent: str) -> None:
        # Explicit parent groups let plain zarr.open_group walk the hierarchy.
        key = f"{parent}/{GROUP_DOC}" if parent else GROUP_DOC
        await self._store.set_if_not_exists(key, buffer(EMPTY_GROUP_DOC))
        self._parents_known.add(parent)

    def delete(self, path: str) -> None:
        """Remove the group at ``path``, complete or not; absent is fine."""
        rel = self._rel(path)

        async def delete() -> None:
            # Unpublish first so a crash mid-delete leaves an orphan, not a torn group.
            await self._store.delete(f"{rel}/{GROUP_DOC}")
            await self._store.delete_dir(rel)

        # Parent groups under ``rel`` are gone too; write them again when needed.
        self._parents_known.clear()
        self._run(delete(), "deleting", self.shown(rel))

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
        rel = self._rel(path)
        uri = self.shown(rel)
        return self._run(self._read(rel, uri, verify, expect=expect), "reading", uri)

    def reader(self, path: str, verify: bool = True, expect: str | None = None) -> StateReader:
        """The complete state group at ``path``, to read a few tensors at a time
        (``expect``: as for :meth:`read_state`)."""
        return StateReader(self, path, verify, expect)

    def writer(
        self, path: str, specs: Sequence[TensorSpec], attrs: Mapping[str, Any] | None = None
    ) -> StateWriter:
        """A state group at ``path`` to write a few tensors at a time (replacing one there)."""
        return StateWriter(self, path, specs, attrs)

    async def _read(
        self,
        rel: str,
        uri: str,
        verify: bool,
        doc: dict[str, Any] | None = None,
        only: Sequence[str] | None = None,
        expect: str | None = None,
        table: CheckedTable | None = None,
        rows: tuple[int, int] | None = None,
    ) -> StateDict:
        # ``doc``, ``only`` and ``rows``: a StateReader's group document, the
        # names of the tensors it wants, or rows of one (streaming.py).
        group = doc if doc is not None else await self._complete_doc(rel, uri)
        vcdl = group["attributes"][ATTR]
        if expect is not None:
            check_identity(vcdl, expect, uri)
        if vcdl.get("format") == 1:
            return await read_v1(self._reader, self._url, rel, uri, group, verify, _concurrency())
        meta = consolidated_of(group, uri)
        plan = await asyncio.to_thread(plan_read, vcdl, meta, uri, only, table, rows)
        if isinstance(self._reader, LocalStore):
            root = os.path.join(self._url, rel)
            await _in_threads(
                [
                    _bind(store_files.read_chunk, os.path.join(root, c.key), c, uri, verify)
                    for c in plan.chunks
                ]
            )
        else:
            semaphore = asyncio.Semaphore(_concurrency())

            async def fetch(chunk: ChunkRead) -> None:
                async with semaphore:
                    buf = await self._reader.get(f"{rel}/{chunk.key}", PROTOTYPE)
                if buf is None:
                    raise IntegrityError(f"{uri}: {chunk.describe()} is missing (torn group)")
                await asyncio.to_thread(_unpack, buf.as_numpy_array().data, chunk, uri, verify)

            async with asyncio.TaskGroup() as tasks:
                for chunk in plan.chunks:
                    tasks.create_task(fetch(chunk))
        if verify:
            await _verify_all(plan, uri)
        return plan.state()

    def read_attrs(self, path: str) -> dict[str, Any]:
        """The ``attrs`` given to :meth:`write_state` for the complete group at ``path``."""
        rel = self._rel(path)
        uri = self.shown(rel)
        group = self._run(self._complete_doc(rel, uri), "reading", uri)
        return dict(group["attributes"][ATTR].get("attrs") or {})

    def checksum(self, path: str) -> str:
        """One SHA-256 over the group's tensors (name, dtype, shape, checksum; by name).

        It is computed from the recorded metadata, not by reading the data;
        ``read_state(verify=True)`` checks the data against the same records.
        """
        rel = self._rel(path)
        uri = self.shown(rel)
        group = self._run(self._complete_doc(rel, uri), "reading", uri)
        tensors = group["attributes"][ATTR]["tensors"]
        if not isinstance(tensors, dict):
            raise IntegrityError(f"{uri}: the group records no tensors")
        return combined_checksum(tensors)

    def exists(self, path: str) -> bool:
        """True if a complete state group is at ``path``."""
        rel = self._rel(path)
        uri = self.shown(rel)

        async def exists() -> bool:
            doc = await self._get_doc(rel)
            if doc is not None and is_complete(doc):
                return True
            await self._check_bucket()
            return False

        return self._run(exists(), "reading", uri)

    def nbytes(self, path: str = "") -> int:
        """Bytes of every object under ``path`` (the whole store for ``""``); 0 if none.

        What the store holds on disk or in the bucket, metadata included:
        what retention frees and what a user pays for.
        """
        rel = self._rel(path, allow_root=True)

        async def size() -> int:
            if isinstance(self._store, LocalStore):
                base = os.path.join(self._url, rel)

                def walk() -> int:
                    total = 0
                    for root, _, names in os.walk(base):
                        for name in names:
                            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                                total += os.stat(os.path.join(root, name)).st_size
                    return total

                return await asyncio.to_thread(walk)
            fs = self._store.fs
            full = f"{self._store.path}/{rel}".rstrip("/")
            fs.invalidate_cache(full)
            try:
                found = await fs._find(full, detail=True)
            except FileNotFoundError:
                return 0
            return sum(int(info.get("size") or 0) for info in found.values())

        return self._run(size(), "measuring", self.uri(rel))

    def list(self, prefix: str) -> list[str]:
        """Sorted names of the nodes directly under ``prefix`` (complete or not).

        Under a prefix such as ``runs/r1/versions`` these are the state groups;
        orphans from crashes are included so they can be cleaned up. ``[]`` if
        the prefix does not exist.
        """
        rel = self._rel(prefix, allow_root=True)
        names = self._run(self._list(rel), "listing", self.shown(rel))
        return sorted(names)

    async def _list(self, rel: str) -> builtins.list[str]:
        if isinstance(self._store, LocalStore):
            base = os.path.join(self._url, rel)

            def scan() -> builtins.list[str]:
                try:
                    return [e.name for e in os.scandir(base) if e.is_dir()]
                except (FileNotFoundError, NotADirectoryError):
                    return []

            return await asyncio.to_thread(scan)
        fs = self._store.fs
        full = f"{self._store.path}/{rel}".rstrip("/")
        # Another process may have written since this fs listed: no stale cache.
        fs.invalidate_cache(full)
        try:
            entries = await fs._ls(full, detail=True)
        except FileNotFoundError:
            entries = []
        names = [
            e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory"
        ]
        if not names:
            await self._check_bucket()
        return names

    def open_group(self, path: str, mode: str = "r") -> zarr.Group:
        """The raw Zarr group at ``path`` (``mode`` as for :func:`zarr.open_group`).

        For data sets and other plain arrays; state groups are for
        :meth:`write_state` / :meth:`read_state`. Mode ``"r"`` opens through a
        read-only store.
        """
        rel = self._rel(path, allow_root=True)
        uri = self.shown(rel)
        if not rel and mode == "w":
            raise StoreError(f"open_group('', mode='w') would erase the whole store {uri}")
        store = self._reader if mode == "r" else self._store

        try:
            return zarr.open_group(store, path=rel, mode=cast(AccessModeLiteral, mode))
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError) as exc:
            if mode in ("r", "r+"):
                self._run(self._check_bucket(), "opening", uri)
                raise StoreNotFoundError(f"no Zarr group at {uri}") from exc
            raise self._backend_error(exc, "opening", uri) from exc
        except VcdlError:
            raise
        except Exception as exc:
            raise self._backend_error(exc, "opening", uri) from exc

    # ---------------------------------------------------------------- helpers

    def _rel(self, path: str, allow_root: bool = False) -> str:
        """``path`` checked and made relative to the root."""
        if not isinstance(path, str):
            raise StoreError(f"store paths are strings, got {type(path).__name__}")
        rel = path
        for root in (self._url, f"file://{self._url}"):
            if rel == root:
                rel = ""
            elif rel.startswith(root + "/"):
                rel = rel[len(root) + 1 :]
        if "://" in rel or rel.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", rel):
            raise StoreError(
                f"store path {redact_text(path)!r} is absolute or outside "
                f"{redact_url(self._url)}; "
                "give a '/'-separated path relative to the store root"
            )
        rel = rel.rstrip("/")
        parts = rel.split("/") if rel else []
        for part in parts:
            if part in ("", ".", "..") or part.startswith("__") or "\\" in part:
                raise StoreError(
                    f"invalid store path {path!r}: components may not be empty, '.', '..', "
                    "start with '__' or contain '\\'"
                )
        if not parts and not allow_root:
            raise StoreError("an empty path names the store root; give a group path")
        return rel

    async def _get_doc(self, rel: str) -> dict[str, Any] | None:
        """The parsed ``zarr.json`` of the node at ``rel``, or None if it has none."""
        try:
            buf = await self._reader.get(f"{rel}/{GROUP_DOC}", PROTOTYPE)
        except FileNotFoundError:  # a local root that was never written to
            return None
        if buf is None:
            return None
        try:
            doc = json.loads(buf.to_bytes())
        except ValueError:
            return None  # a torn metadata write: treat as absent (an orphan)
        return doc if isinstance(doc, dict) else None

    async def _complete_doc(self, rel: str, uri: str) -> dict[str, Any]:
        doc = await self._get_doc(rel)
        if doc is None:
            await self._check_bucket()
            raise StoreNotFoundError(f"no state group at {uri}")
        if not is_complete(doc):
            attributes = doc.get("attributes")
            if doc.get("node_type") == "group" and not (
                isinstance(attributes, dict) and isinstance(attributes.get(ATTR), dict)
            ):
                raise StoreNotFoundError(f"{uri} is a Zarr group but not a state group")
            raise StoreNotFoundError(f"state group at {uri} is incomplete (a crashed write)")
        fmt = doc["attributes"][ATTR].get("format")
        if fmt not in READABLE_FORMATS:
            raise StoreError(
                f"state group at {uri} has format {fmt!r}; this vcdl reads formats "
                f"{', '.join(map(str, READABLE_FORMATS))} (upgrade vcdl)"
            )
        return doc

    def _bucket(self) -> str | None:
        if self._protocol not in _BUCKET_PROTOCOLS or not isinstance(self._store, FsspecStore):
            return None
        return self._store.path.split("/", 1)[0]

    def _endpoint(self) -> str:
        ep = self._options.get("endpoint_url") or (self._options.get("client_kwargs") or {}).get(
            "endpoint_url"
        )
        return redact_url(ep) if ep else "the default endpoint"

    async def _check_bucket(self) -> None:
        """Raise a clear StoreError if the store's bucket does not exist (once per store)."""
        bucket = self._bucket()
        if bucket is None or self._bucket_checked:
            return
        assert isinstance(self._store, FsspecStore)
        if not await self._store.fs._exists(bucket):
            raise StoreError(
                f"bucket {bucket!r} does not exist at {self._endpoint()}; "
                f"create it or fix store.url ({redact_url(self._url)})"
            )
        self._bucket_checked = True

    def _run(self, coro: Coroutine[Any, Any, _T], what: str, uri: str) -> _T:
        """Run ``coro`` on Zarr's I/O loop; backend failures become StoreError."""
        try:
            return sync(coro)
        except VcdlError:
            raise
        except BaseExceptionGroup as group:  # from a TaskGroup: report the first
            first = group.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            if isinstance(first, VcdlError):
                raise first from group
            raise self._backend_error(first, what, uri) from group
        except Exception as exc:
            raise self._backend_error(exc, what, uri) from exc

    def _backend_error(self, exc: BaseException, what: str, uri: str) -> StoreError:
        # A backend's message may name a URL (an endpoint, a presigned key): redacted too.
        detail = f"{type(exc).__name__}: {redact_text(str(exc))}"
        if isinstance(exc, PermissionError):
            return StoreError(
                f"permission denied {what} {uri}: {detail}; check the credentials "
                "(storage_options key/secret or the environment) and access rights"
            )
        if isinstance(exc, FileNotFoundError) and self._bucket() is not None:
            try:
                sync(self._check_bucket())
            except StoreError as missing:
                return missing
            except Exception:  # the diagnosis failed too; report the original
                pass
        return StoreError(
            f"{what} {uri} failed: {detail}; check store.url and store.storage_options"
        )


def _close_session(fs: Any) -> None:
    """Close s3fs's aiobotocore client on Zarr's loop; best effort (runs at GC/exit)."""
    client = getattr(fs, "_s3", None)
    if client is None:
        return

    async def close() -> None:
        await client.close()

    coro = close()
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the usual case: wait (briefly) for the close
            sync(coro, timeout=2)
        else:  # collected on an event loop thread, maybe Zarr's own: don't block it
            asyncio.run_coroutine_threadsafe(coro, _zarr_loop())
    except Exception:  # the loop is gone (interpreter exit)
        with contextlib.suppress(Exception):
            coro.close()  # never started: no "never awaited" warning


async def _in_threads(jobs: builtins.list[Callable[[], _T]]) -> builtins.list[_T]:
    """Run blocking jobs in Zarr's loop's worker threads; results in order."""
    return list(await asyncio.gather(*(asyncio.to_thread(job) for job in jobs)))


def _bind(fn: Callable[..., _T], *args: Any) -> Callable[[], _T]:
    return lambda: fn(*args)


def _digests(views: builtins.list[memoryview]) -> builtins.list[str]:
    return [digest(v) for v in views]


def _unpack(raw: memoryview, chunk: ChunkRead, uri: str, check_padding: bool) -> None:
    """Copy one fetched chunk's bytes into its destination tensors."""
    chunk.check_size(raw.nbytes, uri)
    for at, view in chunk.pieces:
        view[:] = raw[at : at + view.nbytes]
    if check_padding and chunk.pad_from is not None:
        chunk.check_padding(raw[chunk.pad_from :], uri)


async def _verify_all(plan: ReadPlan, uri: str) -> None:
    tensors = plan.tensors
    await _in_threads([_bind(verify, [tensors[i] for i in job], uri) for job in plan.hash_jobs()])


def _concurrency() -> int:
    return max(1, int(zarr.config.get("async.concurrency") or 10))

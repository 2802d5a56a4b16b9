"""Group I/O of the weight store: what writing, reading and removing a group does to it.

This module owns the order of a state group's life on the backend, written
once: :class:`~vcdl.store.weights.WeightStore` (whole states) and the
streaming reader and writer (:mod:`vcdl.store.streaming`, a few tensors at a
time) both call :class:`Groups`, and nothing else writes to a group.

* :meth:`Groups.begin`, the crash-safe start of a write: refuse a Zarr node
  vcdl did not write, unpublish the group there (its ``zarr.json`` first, so
  that a crash leaves an orphan, never a torn group), delete the rest, write
  the parent groups and the arrays' metadata;
* :meth:`Groups.put_chunks` and :meth:`Groups.read_tensors`, a group's
  chunks out and in (on a local disk from and into the tensors' own memory,
  :mod:`vcdl.store.files`); reading verifies every whole tensor;
* :meth:`Groups.publish`, the commit point: the group's document, last;
* :meth:`Groups.doc` and :meth:`Groups.complete_doc`, a group's document;
* :meth:`Groups.delete`, :meth:`Groups.names` and :meth:`Groups.nbytes`.

Which root, which paths, and how a call runs and fails is
:mod:`vcdl.store.backend`'s (:class:`Groups` is a
:class:`~vcdl.store.backend.Backend`); what the bytes are is
:mod:`vcdl.store.layout`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from zarr.core.buffer import Buffer
from zarr.storage import FsspecStore

from vcdl.errors import IntegrityError, StoreError, StoreNotFoundError
from vcdl.store import files as store_files
from vcdl.store.arrays import GROUP_DOC, PROTOTYPE
from vcdl.store.backend import Backend, concurrency, in_threads
from vcdl.store.layout import (
    ATTR,
    READABLE_FORMATS,
    ChunkRead,
    ReadPlan,
    is_complete,
    is_state_doc,
)
from vcdl.store.layout import verify as verify_tensors
from vcdl.types import StateDict

# What a parent group holds: explicit parents let plain zarr.open_group walk the hierarchy.
_EMPTY_GROUP_DOC = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


class Groups(Backend):
    """The state groups under one root URL (see the module).

    ``url`` and ``storage_options`` as for :class:`~vcdl.store.weights.WeightStore`.
    Constructing it does no I/O. ``rel`` in the methods: a path :meth:`rel` checked;
    ``uri``: the group as messages show it (:meth:`shown`). Each method is a
    coroutine, run by the caller with :meth:`run` (several in one run, if it likes).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self._parents_known: set[str] = set()

    def reopened(self) -> Groups:
        """The same root opened afresh, for a forked process (the parent's asynchronous
        clients are bound to its own I/O loop, which a child does not have)."""
        return Groups(self.url, self._options)

    # -------------------------------------------------------------- documents

    async def doc(self, rel: str) -> dict[str, Any] | None:
        """The parsed ``zarr.json`` of the node at ``rel``, or None if it has none."""
        try:
            buf = await self.reader.get(f"{rel}/{GROUP_DOC}", PROTOTYPE)
        except FileNotFoundError:  # a local root that was never written to
            return None
        if buf is None:
            return None
        try:
            doc = json.loads(buf.to_bytes())
        except ValueError:
            return None  # a torn metadata write: treat as absent (an orphan)
        return doc if isinstance(doc, dict) else None

    async def complete_doc(self, rel: str, uri: str) -> dict[str, Any]:
        """The document of the complete state group at ``rel``, of a format this vcdl reads.

        Raises :class:`StoreNotFoundError` for no group, an orphan or a plain
        Zarr group, :class:`StoreError` for a format of a later vcdl.
        """
        doc = await self.doc(rel)
        if doc is None:
            await self.check_bucket()
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

    # ---------------------------------------------------------------- writing

    async def begin(self, rel: str, uri: str, metas: Mapping[str, bytes], writer: str) -> None:
        """The crash-safe start of every write of a state group at ``rel``.

        Refuses a Zarr node there that is not a state group (the message says
        ``writer`` did not write it). Then unpublishes the group there, its
        document first, and deletes the rest: a crash in between leaves an
        orphan. Then writes the parent groups and each array's metadata
        (``metas``: array node to its ``zarr.json``). The chunks come next
        (:meth:`put_chunks`), the group's document last (:meth:`publish`).
        """
        existing = await self.doc(rel)
        if existing is not None and not is_state_doc(existing):
            raise StoreError(
                f"{uri} holds a Zarr {existing.get('node_type', 'node')} that {writer} did "
                "not write; refusing to overwrite it (delete it first if that is intended)"
            )
        await self._remove(rel)
        parts = rel.split("/")
        await asyncio.gather(
            *(
                self._ensure_parent(parent)
                for parent in ("/".join(parts[:i]) for i in range(len(parts)))
                if parent not in self._parents_known
            )
        )
        root = self.local_dir(rel)
        if root is not None:

            def write_metas() -> None:
                # The array directories must exist before their chunks are written.
                for node, meta in metas.items():
                    store_files.write_file(os.path.join(root, node, GROUP_DOC), meta)

            await asyncio.to_thread(write_metas)
            return
        await asyncio.gather(
            *(self.store.set(f"{rel}/{node}/{GROUP_DOC}", _buffer(m)) for node, m in metas.items())
        )

    async def _ensure_parent(self, parent: str) -> None:
        key = f"{parent}/{GROUP_DOC}" if parent else GROUP_DOC
        await self.store.set_if_not_exists(key, _buffer(_EMPTY_GROUP_DOC))
        self._parents_known.add(parent)

    async def put_hashed(
        self, rel: str, chunks: Sequence[tuple[str, Sequence[tuple[memoryview, Any]]]]
    ) -> None:
        """:meth:`put_chunks`, each buffer with the hasher (or None) of the tensor it is
        part of, which is fed those bytes in order. On a local disk the chunks are
        written one after another, a piece at a time, each piece hashed right after
        it is written, while in the cache (:func:`~vcdl.store.files.write_hashed`);
        to a remote store they go concurrently while one thread hashes."""
        root = self.local_dir(rel)
        if root is not None:
            jobs = [(os.path.join(root, key), pieces) for key, pieces in chunks]
            await asyncio.to_thread(store_files.write_hashed, jobs)
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.put_chunks(rel, [(k, [v for v, _ in p]) for k, p in chunks]))
            tasks.create_task(asyncio.to_thread(store_files.feed, [p for _, p in chunks]))

    async def put_chunks(
        self, rel: str, chunks: Sequence[tuple[str, Sequence[memoryview]]]
    ) -> None:
        """Write chunks of the group at ``rel`` (after :meth:`begin`): per chunk, its key
        under ``rel`` (``<array>/c.<j>``) and the buffers that make it up, in order."""
        root = self.local_dir(rel)
        if root is not None:
            await in_threads(
                [
                    functools.partial(store_files.write_chunk, os.path.join(root, key), views)
                    for key, views in chunks
                ]
            )
            return
        semaphore = asyncio.Semaphore(concurrency())

        async def put(key: str, views: Sequence[memoryview]) -> None:
            async with semaphore:
                data = views[0] if len(views) == 1 else b"".join(views)
                await self.store.set(f"{rel}/{key}", _buffer(data))

        async with asyncio.TaskGroup() as tasks:
            for key, views in chunks:
                tasks.create_task(put(key, views))

    async def publish(self, rel: str, doc: bytes) -> None:
        """The commit point: write the group's document, the last write of a group."""
        await self.store.set(f"{rel}/{GROUP_DOC}", _buffer(doc))

    async def delete(self, rel: str) -> None:
        """Remove the group at ``rel``, complete or not, its document first; absent is fine."""
        # Parent groups under ``rel`` are gone too; write them again when needed.
        self._parents_known.clear()
        await self._remove(rel)

    async def _remove(self, rel: str) -> None:
        # Unpublish first so a crash mid-delete leaves an orphan, not a torn group.
        await self.store.delete(f"{rel}/{GROUP_DOC}")
        await self.store.delete_dir(rel)

    # ---------------------------------------------------------------- reading

    async def read_tensors(self, rel: str, uri: str, plan: ReadPlan, verify: bool) -> StateDict:
        """The tensors of ``plan`` (a format 2 group's): every chunk read straight into their
        memory; with ``verify``, each whole tensor checked against its checksum (on a local
        disk, as it is read; from a remote store, once its chunks are in)."""
        root = self.local_dir(rel)
        if root is not None and verify:
            # Each tensor read in order and hashed a piece at a time, while in the
            # cache (store_files.read_verified); the last chunks' padding apart.
            by_key = {(c.array.node, c.index): c for c in plan.chunks}
            tensors = plan.tensors
            await in_threads(
                [
                    functools.partial(
                        store_files.read_verified, root, [tensors[i] for i in job], by_key, uri
                    )
                    for job in plan.hash_jobs()
                ]
                + [
                    functools.partial(store_files.check_chunk, os.path.join(root, c.key), c, uri)
                    for c in plan.chunks
                    if c.pad_from is not None
                ]
            )
            return plan.state()
        if root is not None:
            await in_threads(
                [
                    functools.partial(
                        store_files.read_chunk, os.path.join(root, c.key), c, uri, verify
                    )
                    for c in plan.chunks
                ]
            )
        else:
            semaphore = asyncio.Semaphore(concurrency())

            async def fetch(chunk: ChunkRead) -> None:
                async with semaphore:
                    buf = await self.reader.get(f"{rel}/{chunk.key}", PROTOTYPE)
                if buf is None:
                    raise IntegrityError(f"{uri}: {chunk.describe()} is missing (torn group)")
                await asyncio.to_thread(_unpack, buf.as_numpy_array().data, chunk, uri, verify)

            async with asyncio.TaskGroup() as tasks:
                for chunk in plan.chunks:
                    tasks.create_task(fetch(chunk))
        if verify:
            tensors = plan.tensors
            await in_threads(
                [
                    functools.partial(verify_tensors, [tensors[i] for i in job], uri)
                    for job in plan.hash_jobs()
                ]
            )
        return plan.state()

    async def names(self, rel: str) -> list[str]:
        """Names of the nodes directly under ``rel``, unsorted; ``[]`` if it does not exist."""
        root = self.local_dir(rel)
        if root is not None:

            def scan() -> list[str]:
                try:
                    return [e.name for e in os.scandir(root) if e.is_dir()]
                except (FileNotFoundError, NotADirectoryError):
                    return []

            return await asyncio.to_thread(scan)
        assert isinstance(self.store, FsspecStore)
        fs = self.store.fs
        full = f"{self.store.path}/{rel}".rstrip("/")
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
            await self.check_bucket()
        return names

    async def nbytes(self, rel: str) -> int:
        """Bytes of every object under ``rel``, metadata included; 0 if none."""
        root = self.local_dir(rel)
        if root is not None:

            def walk() -> int:
                total = 0
                for where, _, names in os.walk(root):
                    for name in names:
                        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                            total += os.stat(os.path.join(where, name)).st_size
                return total

            return await asyncio.to_thread(walk)
        assert isinstance(self.store, FsspecStore)
        fs = self.store.fs
        full = f"{self.store.path}/{rel}".rstrip("/")
        fs.invalidate_cache(full)
        try:
            found = await fs._find(full, detail=True)
        except FileNotFoundError:
            return 0
        return sum(int(info.get("size") or 0) for info in found.values())


def _buffer(data: bytes | memoryview) -> Buffer:
    return PROTOTYPE.buffer.from_bytes(data)


def _unpack(raw: memoryview, chunk: ChunkRead, uri: str, check_padding: bool) -> None:
    """Copy one fetched chunk's bytes into its destination tensors."""
    chunk.check_size(raw.nbytes, uri)
    for at, view in chunk.pieces:
        view[:] = raw[at : at + view.nbytes]
    if check_padding and chunk.pad_from is not None:
        chunk.check_padding(raw[chunk.pad_from :], uri)

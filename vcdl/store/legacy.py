"""Reading state groups of format 1 (one Zarr array per tensor), written by vcdl <= 0.1.

This module owns only the decoding of that older layout; nothing writes it
any more (format 2 is :mod:`vcdl.store.layout`). Layout of a format 1 group::

    <path>/zarr.json             group metadata: attributes["vcdl"] and the
                                 consolidated metadata of every array
    <path>/<node>/zarr.json      one array per tensor
    <path>/<node>/c.0.0...       its only chunk: raw little-endian bytes, no
                                 compression (chunk shape = tensor shape)

Each tensor record is ``{"dtype", "shape", "checksum", "array"}``, ``array``
naming its node; checksums are SHA-256 of the chunk's bytes, as in format 2.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from zarr.storage import FsspecStore, LocalStore

from vcdl.errors import IntegrityError
from vcdl.store.arrays import PROTOTYPE, torch_dtype
from vcdl.store.layout import ATTR, digest
from vcdl.types import StateDict


async def read_v1(
    reader: LocalStore | FsspecStore,
    root: str,
    rel: str,
    uri: str,
    group: Mapping[str, Any],
    verify: bool,
    limit: int,
) -> StateDict:
    """The state of the format 1 group whose (complete) document is ``group``."""
    vcdl = group["attributes"][ATTR]
    consolidated = (group.get("consolidated_metadata") or {}).get("metadata") or {}
    semaphore = asyncio.Semaphore(limit)

    async def read_one(name: str, record: Mapping[str, Any]) -> torch.Tensor:
        node = record.get("array")
        # The record names the node; never let it point outside the group.
        if not isinstance(node, str) or "/" in node or node in ("", ".", ".."):
            raise IntegrityError(f"{uri}: tensor {name!r} records a bad node {node!r}")
        meta = consolidated.get(node)
        if meta is None:
            raise IntegrityError(f"{uri}: no array metadata for tensor {name!r}")
        async with semaphore:
            spec = _ArraySpec.parse(meta, name, record, uri)
            key = f"{rel}/{node}/{spec.chunk_key}"
            if isinstance(reader, LocalStore):
                path = os.path.join(root, key)
                return await asyncio.to_thread(_decode_file, path, spec, record, name, uri, verify)
            raw = None
            if spec.nbytes:
                buf = await reader.get(key, PROTOTYPE)
                if buf is None:
                    raise IntegrityError(f"{uri}: chunk of tensor {name!r} is missing (torn group)")
                raw = buf.as_numpy_array()
        return await asyncio.to_thread(_decode, raw, spec, record, name, uri, verify)

    async with asyncio.TaskGroup() as tasks:
        jobs = {
            name: tasks.create_task(read_one(name, rec)) for name, rec in vcdl["tensors"].items()
        }
    return {name: job.result() for name, job in jobs.items()}


class _ArraySpec:
    """What reading one stored tensor needs, checked against its record."""

    __slots__ = ("chunk_key", "nbytes", "np_dtype", "shape", "torch_dtype")

    def __init__(
        self, chunk_key: str, np_dtype: np.dtype, shape: tuple[int, ...], dtype: torch.dtype
    ) -> None:
        self.chunk_key = chunk_key
        self.np_dtype = np_dtype
        self.shape = shape
        self.torch_dtype = dtype
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize

    @classmethod
    def parse(
        cls, meta: Mapping[str, Any], name: str, record: Mapping[str, Any], uri: str
    ) -> _ArraySpec:
        try:
            shape = tuple(int(s) for s in meta["shape"])
            np_dtype = np.dtype(meta["data_type"]).newbyteorder("<")
            codecs = meta["codecs"]
            encoding = meta["chunk_key_encoding"]
            separator = encoding.get("configuration", {}).get("separator", "/")
            chunk_shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"{uri}: metadata of tensor {name!r} is malformed: {exc}") from exc
        plain = (
            len(codecs) == 1
            and codecs[0].get("name") == "bytes"
            and codecs[0].get("configuration", {}).get("endian", "little") == "little"
            and encoding.get("name") == "default"
            and list(chunk_shape) == [max(1, s) for s in shape]
        )
        if not plain:
            raise IntegrityError(
                f"{uri}: array of tensor {name!r} is not in vcdl's layout (one uncompressed "
                "chunk); was it rewritten by another tool?"
            )
        if list(shape) != list(record.get("shape", [])):
            raise IntegrityError(
                f"{uri}: tensor {name!r} records shape {record.get('shape')} "
                f"but its array has shape {list(shape)}"
            )
        dtype = torch_dtype(str(record.get("dtype")), uri, name)
        if dtype.itemsize != np_dtype.itemsize:
            raise IntegrityError(
                f"{uri}: tensor {name!r} records dtype {dtype} but its array holds {np_dtype.name}"
            )
        chunk_key = "c" + "".join(separator + "0" for _ in shape)
        return cls(chunk_key, np_dtype, shape, dtype)


def _decode_file(
    path: str, spec: _ArraySpec, record: Mapping[str, Any], name: str, uri: str, verify: bool
) -> torch.Tensor:
    """Read one local chunk file into fresh memory and rebuild the tensor."""
    data = np.empty(spec.nbytes, dtype=np.uint8)
    if spec.nbytes:
        try:
            with open(path, "rb", buffering=0) as f:
                got = f.readinto(data.data)
                extra = f.read(1)
        except (FileNotFoundError, NotADirectoryError):
            raise IntegrityError(
                f"{uri}: chunk of tensor {name!r} is missing (torn group)"
            ) from None
        if got != spec.nbytes or extra:
            size = os.path.getsize(path)
            raise IntegrityError(
                f"{uri}: chunk of tensor {name!r} has {size} bytes, expected {spec.nbytes}"
            )
    return _decode(data, spec, record, name, uri, verify)


def _decode(
    raw: np.ndarray | None,
    spec: _ArraySpec,
    record: Mapping[str, Any],
    name: str,
    uri: str,
    verify: bool,
) -> torch.Tensor:
    """Rebuild one tensor from its chunk bytes (run in a worker thread)."""
    data = raw if raw is not None else np.empty(0, dtype=np.uint8)
    if data.nbytes != spec.nbytes:
        raise IntegrityError(
            f"{uri}: chunk of tensor {name!r} has {data.nbytes} bytes, expected {spec.nbytes}"
        )
    if verify and digest(data.reshape(-1).view(np.uint8).data) != record.get("checksum"):
        raise IntegrityError(
            f"{uri}: checksum mismatch in array {record.get('array', name)!r} "
            f"(tensor {name!r}): stored bytes are corrupt"
        )
    array = data.view(spec.np_dtype).reshape(spec.shape)
    if not array.flags.writeable or not array.dtype.isnative:
        # Own writable memory in native byte order (torch warns on read-only arrays).
        array = array.astype(spec.np_dtype.newbyteorder("="))
    tensor = torch.from_numpy(array)
    if tensor.dtype != spec.torch_dtype:  # raw bits of a dtype numpy lacks
        tensor = tensor.view(spec.torch_dtype)
    return tensor

"""One flat Zarr v3 array of a state group, and how a tensor's bytes are stored in it.

This module owns what a state group's arrays are, one at a time, with no
I/O and no policy: :class:`ArrayLayout` (an array's length, element type
and chunking, and where its chunks are named), the array's metadata
document as Zarr v3 writes it (built with zarr's own metadata class) and
its parsing back, refusing what vcdl never writes; and the mapping between
torch dtypes and stored element types (dtypes numpy lacks are stored as
their bits, :func:`bits_dtype`), with a tensor's bytes as stored
(:func:`bytes_of`). How large an array's chunks are, and which tensor goes
where, is the format's (:mod:`vcdl.store.layout`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from zarr.core.buffer import default_buffer_prototype

from vcdl.errors import IntegrityError, StoreError

GROUP_DOC = "zarr.json"
"""The metadata document of a Zarr v3 node (a group or an array), beside its chunks."""

PROTOTYPE = default_buffer_prototype()
"""zarr's buffer prototype: how bytes are handed to and taken from its stores."""

# Torch dtypes numpy cannot hold (bfloat16, float8, complex32) are stored as
# their raw bits in an integer type of the same width and viewed back.
_BITS_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Zarr v3 JSON fill values (padding of the last chunk; never part of a tensor).
_FILL_BY_KIND: dict[str, Any] = {"b": False, "c": [0.0, 0.0], "f": 0.0}


@dataclass
class ArrayLayout:
    """One flat array of a group: its Zarr metadata and its chunking."""

    node: str
    data_type: str
    itemsize: int
    length: int
    chunk_elems: int

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_elems * self.itemsize

    @property
    def nchunks(self) -> int:
        return -(-self.length // self.chunk_elems)

    @property
    def data_bytes(self) -> int:
        return self.length * self.itemsize

    def chunk_key(self, j: int) -> str:
        return f"c.{j}"

    def meta(self) -> tuple[dict[str, Any], bytes]:
        """The array's Zarr v3 metadata: the document and its bytes."""
        return _array_meta(self.length, self.chunk_elems, self.data_type)


@functools.lru_cache(maxsize=256)
def _array_meta(length: int, chunk: int, data_type: str) -> tuple[dict[str, Any], bytes]:
    # Built with zarr's own metadata class, so the document is valid by zarr's rules.
    from zarr.core.metadata.v3 import ArrayV3Metadata

    meta = ArrayV3Metadata.from_dict(
        {
            "zarr_format": 3,
            "node_type": "array",
            "shape": [length],
            "data_type": data_type,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
            # "." keeps chunks as files beside zarr.json, not in a c/ directory.
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
            "fill_value": _FILL_BY_KIND.get(np.dtype(data_type).kind, 0),
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "attributes": {},
        }
    )
    return meta.to_dict(), meta.to_buffer_dict(PROTOTYPE)[GROUP_DOC].to_bytes()


def parse_array(meta: Mapping[str, Any], node: str, uri: str) -> ArrayLayout:
    """An :class:`ArrayLayout` from stored metadata, refusing anything not ours."""
    try:
        shape, chunks = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
        codecs, encoding = meta["codecs"], meta["chunk_key_encoding"]
        plain = (
            isinstance(shape, list)
            and len(shape) == 1
            and is_int(shape[0])
            and shape[0] >= 0
            and meta["chunk_grid"]["name"] == "regular"
            and isinstance(chunks, list)
            and len(chunks) == 1
            and is_int(chunks[0])
            and chunks[0] >= 1
            and isinstance(codecs, list)
            and len(codecs) == 1
            and isinstance(codecs[0], dict)
            and codecs[0].get("name") == "bytes"
            and (codecs[0].get("configuration") or {}).get("endian", "little") == "little"
            and isinstance(encoding, dict)
            and encoding.get("name") == "default"
            and (encoding.get("configuration") or {}).get("separator") == "."
        )
        data_type = meta["data_type"]
        np_dtype = np.dtype(data_type) if isinstance(data_type, str) else None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"{uri}: metadata of array {node!r} is malformed: {exc}") from exc
    if not plain or np_dtype is None or np_dtype.kind not in "biufc" or np_dtype.itemsize < 1:
        raise IntegrityError(
            f"{uri}: array {node!r} is not in vcdl's layout (flat, uncompressed, '.' chunk "
            "keys); was it rewritten by another tool?"
        )
    return ArrayLayout(node, np_dtype.name, np_dtype.itemsize, shape[0], chunks[0])


def bytes_of(name: str, tensor: torch.Tensor, uri: str) -> np.ndarray:
    """The tensor's data as a contiguous little-endian numpy array (a view if possible)."""
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise StoreError(f"writing {uri}: tensor {name!r} is {tensor.layout}; only dense tensors")
    try:
        t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    except (RuntimeError, NotImplementedError) as exc:  # e.g. meta tensors
        raise StoreError(f"writing {uri}: tensor {name!r} cannot be copied to CPU: {exc}") from exc
    bits = bits_dtype(t.dtype)
    array = (t.view(bits) if bits is not None else t).numpy()
    if sys.byteorder != "little":  # Zarr's bytes codec and the checksums are little-endian
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


@functools.cache
def bits_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The same-width integer dtype to store ``dtype``'s bits in, if numpy lacks it."""
    try:
        torch.empty(0, dtype=dtype).numpy()
    except TypeError:
        bits = _BITS_BY_ITEMSIZE.get(dtype.itemsize)
        if bits is None:
            raise StoreError(f"cannot store tensors of dtype {dtype}") from None
        return bits
    return None


def zarr_dtype(dtype: np.dtype) -> str:
    """The Zarr v3 data type name of a stored numpy dtype (its byte order left out)."""
    return np.dtype(dtype).newbyteorder("=").name


def torch_dtype(name: object, uri: str, tensor: str) -> torch.dtype:
    """The torch dtype a tensor's record names; an :class:`IntegrityError` for any other name."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise IntegrityError(f"{uri}: tensor {tensor!r} records unknown dtype {name!r}")
    return dtype


def is_int(v: object) -> bool:
    """An integer of a JSON document, not a boolean."""
    return isinstance(v, int) and not isinstance(v, bool)

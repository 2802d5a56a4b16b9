"""The weight store: state dicts as Zarr v3 groups, on a local disk or S3.

:mod:`.weights` (the store), :mod:`.streaming` (a group read and written a
few tensors at a time), :mod:`.groups` (a group's writes, reads and removal
on the backend, for both), :mod:`.backend` (the root URL, paths, errors),
:mod:`.s3retry` (transient S3 errors retried), :mod:`.layout` (the packed
format 2), :mod:`.arrays` (one array and the stored dtypes), :mod:`.files`
(local chunk I/O), :mod:`.legacy` (format 1 reader), :mod:`.paths` (where a
run's groups live).
"""

from __future__ import annotations

from vcdl.store.weights import WeightStore, open_store

__all__ = [
    "WeightStore",
    "open_store",
]

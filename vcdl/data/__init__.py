"""Training data: data sets of named arrays in Zarr, importers, built-in sets, shard plans.

:mod:`.datasets` (layout, open, read rows), :mod:`.dataset_write` (checking
and writing a data set), :mod:`.cache` (decoded
splits per worker process), :mod:`.importers` (npz, text, Parquet/Arrow),
:mod:`.decoded` (what an imported file decodes to, checked before it is read),
:mod:`.parquet_read` (a Parquet file read within the import's memory ceiling:
footer, page headers, then batch by batch),
:mod:`.builtin` (digits, MNIST-1D, the Python language reference),
:mod:`.shards` (shard plans), :mod:`.sizing` (shard sizes by throughput),
:mod:`.stream` (a shard read chunk by chunk).
"""

from __future__ import annotations

from vcdl.data.builtin import make_digits, make_mnist1d, make_pytext
from vcdl.data.dataset_write import dataset_fingerprint, write_arrays, write_dataset
from vcdl.data.datasets import (
    DATASETS_PREFIX,
    ArrayInfo,
    DatasetInfo,
    SplitInfo,
    list_datasets,
    open_dataset,
    read_arrays,
    read_rows,
    stream_rows,
)
from vcdl.data.importers import import_npz, import_table, import_text
from vcdl.data.shards import shard_indices, shard_plan

__all__ = [
    "DATASETS_PREFIX",
    "ArrayInfo",
    "DatasetInfo",
    "SplitInfo",
    "dataset_fingerprint",
    "import_npz",
    "import_table",
    "import_text",
    "list_datasets",
    "make_digits",
    "make_mnist1d",
    "make_pytext",
    "open_dataset",
    "read_arrays",
    "read_rows",
    "shard_indices",
    "shard_plan",
    "stream_rows",
    "write_arrays",
    "write_dataset",
]

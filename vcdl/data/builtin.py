"""Built-in small real data sets, made from installed packages (never downloaded).

:func:`make_digits`: scikit-learn's bundled 8x8 digits; :func:`make_mnist1d`:
MNIST-1D, Greydanus & Kobak 2020, https://arxiv.org/abs/2011.14439,
generated procedurally; :func:`make_pytext`: the Python language reference
that ships with the interpreter, as byte-level token rows for language
models.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from vcdl.data.dataset_write import write_arrays, write_dataset
from vcdl.data.datasets import DatasetInfo, DatasetStore
from vcdl.data.importers import TEXT_VOCAB, text_splits, unigram_entropy
from vcdl.errors import DataError


def make_digits(
    store: DatasetStore,
    name: str = "digits",
    size: int = 32,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DatasetInfo:
    """scikit-learn's bundled 8x8 digits (1,797 images, no download), as ``(N, 1, size, size)``.

    Pixels are scaled to [0, 1] and upsampled by nearest neighbour (each pixel
    becomes a ``size/8`` square) so image-sized models apply. The split is
    stratified and seeded.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if size < 8 or size % 8:
        raise DataError(f"size must be a positive multiple of 8, got {size}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # values 0..16 -> [0, 1]
    factor = size // 8
    x = np.kron(images, np.ones((1, factor, factor), dtype=np.float32))[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return write_dataset(
        store,
        name,
        x_train,
        y_train,
        x_test,
        y_test,
        source=f"sklearn.datasets.load_digits(size={size}, test_fraction={test_fraction}, "
        f"seed={seed})",
        num_classes=10,
    )


_MPL_TMP: str | None = None


def _private_cache_dir() -> str:
    """One temp dir per user, shared by this user's processes and kept.

    A fresh dir per process, removed at exit, was left behind by every
    process that never reached exit (a killed worker, a Dask worker's
    ``os._exit``): dozens a day. One per user stays one; matplotlib locks
    its font cache file, so processes may share it. A dir another user
    owns or can write to is not used: then a fresh one, removed at exit.
    """
    path = os.path.join(tempfile.gettempdir(), f"vcdl-matplotlib-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        path = ""
    if path:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
            return path
    fresh = tempfile.mkdtemp(prefix="vcdl-matplotlib-")
    atexit.register(shutil.rmtree, fresh, ignore_errors=True)
    return fresh


@contextmanager
def _matplotlib_cache_in_tmp() -> Iterator[None]:
    """Keep matplotlib's font cache out of ``~/.cache`` while importing mnist1d.

    ``mnist1d/__init__`` imports ``matplotlib.pyplot`` (for its plotting
    helper), whose first import writes a font list into the user's cache
    directory. Unless the user chose a directory or matplotlib is already
    loaded, point it at :func:`_private_cache_dir`.
    """
    global _MPL_TMP
    if "matplotlib" in sys.modules or "MPLCONFIGDIR" in os.environ:
        yield
        return
    if _MPL_TMP is None:
        _MPL_TMP = _private_cache_dir()
    os.environ["MPLCONFIGDIR"] = _MPL_TMP
    try:
        yield
    finally:
        # matplotlib caches the directory at import; the env var can go.
        os.environ.pop("MPLCONFIGDIR", None)


def make_mnist1d(
    store: DatasetStore, name: str = "mnist1d", samples: int = 40000, seed: int = 42
) -> DatasetInfo:
    """MNIST-1D generated locally: x ``(N, 40)`` float32, 10 classes, 80/20 split.

    Calls ``mnist1d.data.make_dataset`` directly: unlike ``get_dataset`` it
    neither downloads the reference pickle nor writes a cache file. It seeds
    the global ``random``/``np.random`` state; that state is restored after.
    About 0.2 ms per sample (40,000 in ~8 s on one core).
    """
    if samples < 10:
        raise DataError(f"samples must be >= 10 (one per class), got {samples}")
    with _matplotlib_cache_in_tmp():
        from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = int(samples)
    args.seed = int(seed)
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return write_dataset(
        store,
        name,
        np.asarray(d["x"], dtype=np.float32),
        np.asarray(d["y"], dtype=np.int64),
        np.asarray(d["x_test"], dtype=np.float32),
        np.asarray(d["y_test"], dtype=np.int64),
        source=f"mnist1d.data.make_dataset(num_samples={samples}, seed={seed})",
        num_classes=10,
    )


def pytext_bytes() -> bytes:
    """The English text of the Python language reference that ships with the interpreter.

    ``pydoc_data.topics`` (what ``help()`` shows for keywords and topics),
    joined in the order of its topic names, as UTF-8: ~470 KB on Python 3.11.
    """
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip() for k in sorted(topics)).encode("utf-8")


def make_pytext(
    store: DatasetStore, name: str = "pytext", context: int = 128, test_fraction: float = 0.1
) -> DatasetInfo:
    """The Python language reference (:func:`pytext_bytes`) as byte-level token rows.

    Rows of ``context + 1`` tokens (field ``tokens``, uint8); the last
    ``test_fraction`` of the text is the held-out split.
    """
    data = pytext_bytes()
    return write_arrays(
        store,
        name,
        text_splits(data, context, test_fraction),
        source=f"pydoc_data.topics of Python {sys.version.split()[0]} ({len(data)} bytes)",
        hints={"vocab_size": TEXT_VOCAB, "context_length": context},
        stats={"unigram_entropy": unigram_entropy(data)},
    )

"""What a data set is, as ``vcdl data`` shows it, and what its statistics say of a run.

:func:`dataset_doc` is the object ``data list --json`` and ``data make/import
--json`` print; :func:`describe` its one-line text; :func:`baseline_line`
sets a text run's test loss beside its data set's unigram entropy.
"""

from __future__ import annotations

import json
from typing import Any


def dataset_doc(store: Any, info: Any) -> dict[str, Any]:
    """A data set as ``data list --json`` and ``data make/import --json`` print it."""
    return {
        "name": info.name,
        "source": info.source,
        "fingerprint": info.fingerprint,
        "format": info.format,
        "uri": store.shown("datasets/" + info.name),
        "rows": {name: split.rows for name, split in info.splits.items()},
        "fields": {
            f: {"dtype": a.dtype, "shape": list(a.shape)}
            for f, a in info.splits["train"].arrays.items()
        },
        "hints": {k: v for k, v in sorted(info.hints.items()) if v is not None},
        "stats": dict(sorted(info.stats.items())),
    }


def describe(info: Any) -> str:
    """``"3297 train / 366 test rows; tokens uint8 (129,); vocab_size 256, ..."``."""
    train = info.splits["train"]
    fields = ", ".join(f"{f} {a.dtype} {a.shape}" for f, a in train.arrays.items())
    hints = ", ".join(f"{k} {v}" for k, v in sorted(info.hints.items()) if v is not None)
    stats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(info.stats.items()))
    return (
        f"{info.n_train} train / {info.n_test} test rows; {fields}"
        + (f"; {hints}" if hints else "")
        + (f"; {stats}" if stats else "")
    )


def baseline_line(cfg: Any, summary: dict[str, Any]) -> str | None:
    """A text run's test loss beside the text's unigram entropy (what context must beat).

    None when the summary has no test loss or the data set no unigram entropy
    (or cannot be opened).
    """
    from vcdl.data import open_dataset
    from vcdl.errors import DataError
    from vcdl.runtime import open_store

    loss = (summary.get("test_metrics") or {}).get("loss")
    options = json.dumps(cfg.store.storage_options, sort_keys=True)
    try:
        stats = open_dataset(open_store(cfg.store.url, options), cfg.data.name).stats
    except DataError:
        return None
    entropy = stats.get("unigram_entropy")
    if loss is None or entropy is None:
        return None
    return (
        f"test loss {loss:.3f} nats/token; unigram entropy of '{cfg.data.name}' "
        f"{entropy:.3f} nats/token: {abs(entropy - loss):.3f} "
        + ("below it" if loss < entropy else "ABOVE it: the model learnt less than byte counts")
    )

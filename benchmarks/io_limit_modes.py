"""The machine's-limit contenders of ``benchmarks/big_merge.py``: names and arguments.

Kept apart from :mod:`benchmarks.io_limit` (which imports torch and numpy)
so that ``big_merge``'s parent process, which only starts children, does not.
"""

from __future__ import annotations

from typing import Any

LIMITS = ("limit", "limit-2", "limit-int8", "limit-int8-2", "limit-sha256")
LIMIT_OF = {
    "streamed": "limit",
    "sharded": "limit-2",
    "streamed-int8": "limit-int8",
    "sharded-int8": "limit-int8-2",
}
"""Each merge contender and the limit it is a fraction of (the same bytes, K pipelines)."""


def limit_args(mode: str) -> dict[str, Any]:
    """:func:`benchmarks.io_limit.run_limit`'s arguments for a limit contender."""
    if mode not in LIMITS:
        raise ValueError(f"not a limit contender: {mode}")
    return {
        "source": "result-int8" if "-int8" in mode else "result",
        "pipelines": 2 if mode.endswith("-2") else 1,
        "sha256": mode.endswith("-sha256"),
    }

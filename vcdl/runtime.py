"""Where a run lives, and the per-process handles to it.

A :class:`RunRef` is what travels through Prefect and Dask instead of tensors:
the run's name and the URLs of its ledger and weight store. Workers turn it
into open handles with :func:`open_ledger` / :func:`open_store`, which are
cached per process so that a worker running many attempts keeps one
connection pool and one store client.

This module also owns the layout of a run inside the store.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vcdl.config import RunConfig
from vcdl.ledger import Ledger
from vcdl.store import WeightStore


class RunRef(BaseModel):
    """A run's name and where its state lives; small and serializable."""

    model_config = ConfigDict(frozen=True)

    run: str
    ledger_url: str
    store_url: str
    storage_options: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> RunRef:
        """The reference for a config whose locations are resolved."""
        if cfg.run.name is None or cfg.ledger.url is None or cfg.store.url is None:
            raise ValueError("config has no run name or unresolved locations")
        return cls(
            run=cfg.run.name,
            ledger_url=cfg.ledger.url,
            store_url=cfg.store.url,
            storage_options=dict(cfg.store.storage_options),
        )

    def ledger(self) -> Ledger:
        return open_ledger(self.ledger_url)

    def store(self) -> WeightStore:
        return open_store(self.store_url, json.dumps(self.storage_options, sort_keys=True))

    def config(self) -> RunConfig:
        """The run's config as recorded in the ledger (the source of truth)."""
        return RunConfig.model_validate_json(self.ledger().get_run(self.run).config)


@functools.lru_cache(maxsize=8)
def open_ledger(url: str, *, create: bool = True) -> Ledger:
    """One :class:`Ledger` (engine and pool) per URL per process.

    ``create=False`` for commands that only read: a ledger that does not exist
    raises :class:`~vcdl.errors.LedgerNotFound` instead of being created empty.
    """
    return Ledger(url, create=create)


@functools.lru_cache(maxsize=8)
def open_store(url: str, storage_options_json: str = "{}") -> WeightStore:
    """One :class:`WeightStore` per URL and options per process."""
    return WeightStore(url, json.loads(storage_options_json))


# Store layout of a run. Version groups carry the writer's attempt id so that
# two mergers racing for the same number never write to the same group: the
# loser's group is an orphan the ledger never points to.
def version_path(run: str, number: int, tag: str) -> str:
    return f"runs/{run}/versions/{number:08d}-{tag}"


def versions_prefix(run: str) -> str:
    return f"runs/{run}/versions"


def result_path(run: str, epoch: int, shard: int, attempt_id: str) -> str:
    return f"runs/{run}/results/e{epoch:05d}-s{shard:05d}-{attempt_id}"


def checkpoint_path(run: str, epoch: int, shard: int, attempt_id: str, samples: int) -> str:
    """A checkpoint of an attempt's training, after ``samples``; one group per checkpoint.

    Never overwritten: a replacement reading the one the ledger names while
    its attempt writes the next one reads a complete group, or finds it
    deleted and starts over.
    """
    return f"{result_path(run, epoch, shard, attempt_id)}-ckpt{samples:010d}"


def results_prefix(run: str) -> str:
    return f"runs/{run}/results"

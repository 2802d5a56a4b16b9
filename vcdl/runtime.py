"""Where a run lives, and the per-process handles to it.

A :class:`RunRef` is what travels through Prefect and Dask instead of tensors:
the run's name and the URLs of its ledger and weight store. Workers turn it
into open handles with :func:`open_ledger` / :func:`open_store`, which are
cached per process so that a worker running many attempts keeps one
connection pool and one store client. Commands that read an existing run
find its ledger (:func:`existing_ledger`: never created by a reader), its
recorded config and its reference (:func:`run_ref`).

Where a run's groups live inside the store is :mod:`vcdl.store.paths`.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vcdl.config import RunConfig
from vcdl.config_files import resolve_home
from vcdl.ledger import Ledger
from vcdl.store import WeightStore


class RunRef(BaseModel):
    """A run's name and where its state lives; small and serializable."""

    model_config = ConfigDict(frozen=True)

    run: str
    ledger_url: str
    store_url: str
    storage_options: dict[str, Any] = Field(default_factory=dict)
    # The generation of the driver lease this reference was handed out under
    # (its fencing token): set, the reference's ledger refuses the writes of a
    # driver whose lease has passed on, and workers' claims carry it.
    lease: int | None = None

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

    def ledger(self, *, fenced: bool = True) -> Ledger:
        """The run's ledger; fenced with :attr:`lease` when set and ``fenced`` (the driver's).

        Workers record what they did with ``fenced=False`` (a fact stays a
        fact, whoever drives the run now) and fence only their claims.
        """
        if self.lease is None or not fenced:
            return open_ledger(self.ledger_url)
        return _fenced_ledger(self.ledger_url, self.run, self.lease)

    def leased(self, generation: int) -> RunRef:
        """This reference handed out under lease generation ``generation``."""
        return self.model_copy(update={"lease": generation})

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
def _fenced_ledger(url: str, run: str, generation: int) -> Ledger:
    return open_ledger(url).fenced(run, generation)


@functools.lru_cache(maxsize=8)
def open_store(url: str, storage_options_json: str = "{}") -> WeightStore:
    """One :class:`WeightStore` per URL and options per process."""
    return WeightStore(url, json.loads(storage_options_json))


def run_ref(name: str, home: str | Path | None = None, ledger_url: str | None = None) -> RunRef:
    """The reference of an existing run, its store taken from its recorded config."""
    ledger = existing_ledger(home, ledger_url)
    cfg = recorded_config(name, ledger=ledger)
    assert cfg.store.url is not None  # recorded configs have resolved locations
    return RunRef(
        run=name,
        ledger_url=ledger.url,
        store_url=cfg.store.url,
        storage_options=dict(cfg.store.storage_options),
    )


def recorded_config(
    name: str,
    *,
    home: str | Path | None = None,
    ledger_url: str | None = None,
    ledger: Ledger | None = None,
) -> RunConfig:
    """The config run ``name`` was recorded with (RunNotFound if there is no such run).

    A ledger it opens itself it closes again, found or not: a reader's connection
    left open keeps SQLite's ``-wal`` and ``-shm`` files beside the ledger.
    """
    if ledger is not None:
        return RunConfig.model_validate_json(ledger.get_run(name).config)
    with existing_ledger(home, ledger_url) as opened:
        return RunConfig.model_validate_json(opened.get_run(name).config)


def default_ledger_url(home: str | Path | None = None) -> str:
    return f"sqlite:///{resolve_home(home) / 'ledger.db'}"


def existing_ledger(home: str | Path | None = None, ledger_url: str | None = None) -> Ledger:
    """An existing ledger, for commands that read runs (LedgerNotFound if there is none)."""
    url = ledger_url or os.environ.get("VCDL_LEDGER_URL") or default_ledger_url(home)
    return open_ledger(url, create=False)

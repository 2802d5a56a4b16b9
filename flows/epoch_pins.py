"""An epoch's throughput plan on the Dask fleet (``cluster.sizing = "throughput"``).

:class:`ShardPins` is the I/O edge of :mod:`vcdl.driver.throughput` for one
epoch of :class:`flows.epoch.EpochExecutor`: it creates the epoch's subtasks
with the plan sized on the workers the scheduler has now, and finds the
address each shard's pinned worker has at the moment the shard is submitted.
Pins name workers by their Dask name, which outlives an address, so a resumed
driver's new cluster carries out the recorded plan on the workers it was
sized for.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vcdl.config import RunConfig
from vcdl.data import open_dataset
from vcdl.driver.throughput import pinned_address, plan_epoch
from vcdl.ledger import Ledger
from vcdl.runtime import RunRef

if TYPE_CHECKING:
    from distributed import Client


class ShardPins:
    """The workers an epoch's shards are pinned to, and where those workers are now."""

    def __init__(self, client: Client | None) -> None:
        self.client = client
        self.pinned: dict[int, str] = {}  # shard -> the name of the worker it is pinned to
        self.fleet: dict[str, str] = {}  # the Dask workers, address -> name

    def ensure_subtasks(
        self,
        ref: RunRef,
        cfg: RunConfig,
        ledger: Ledger,
        epoch: int,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        """Create the epoch's subtasks, with a throughput plan under ``cluster.sizing``.

        An epoch whose subtasks exist (a resumed one) keeps the plan they
        were created with: its shards' rows never change. Its pins are kept
        too: they name workers, so a resumed driver's new cluster pins each
        shard to the worker of the same name; a gone one's shard runs anywhere.
        """
        shards = cfg.data.shards
        rows: list[int] | None = None
        workers: list[str] | None = None
        self.fleet = self._read_fleet() if cfg.cluster.sizing == "throughput" else {}
        if self.fleet:
            n = open_dataset(ref.store(), cfg.data.name).n_train
            names = sorted(self.fleet.values())
            plan = plan_epoch(ledger, ref.run, epoch, n, shards, names)
            if plan is not None:
                rows, workers = plan
        subtasks = ledger.ensure_subtasks(ref.run, epoch, shards, rows=rows, workers=workers)
        self.pinned = {s.shard: s.worker for s in subtasks if s.worker is not None}
        if any(s.rows is not None for s in subtasks):
            log.info(
                "epoch %d: shards sized by throughput: %s",
                epoch,
                ", ".join(f"{s.rows} rows on worker {s.worker}" for s in subtasks),
            )

    def address(self, shard: int) -> str | None:
        """The address of the worker the plan pinned ``shard`` to; None: unpinned or gone.

        The fleet is read again when the pin is not in it: the worker may be
        back (restarted, on a new address) since the epoch was planned.
        """
        pin = self.pinned.get(shard)
        if pin is None:
            return None
        address = pinned_address(pin, self.fleet)
        if address is None:
            self.fleet = self._read_fleet()
            address = pinned_address(pin, self.fleet)
        return address

    def _read_fleet(self) -> dict[str, str]:
        """The Dask workers now, address -> name (none outside a Dask task runner)."""
        if self.client is None:
            return {}
        workers = self.client.scheduler_info().get("workers", {})
        return {address: str(info.get("name", address)) for address, info in workers.items()}

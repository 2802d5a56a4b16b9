"""A worker plugin installed on a fleet that loses a worker meanwhile.

Works around distributed 2026.8: ``Client.register_plugin`` asks the
scheduler to broadcast the plugin to every current worker, and one worker
that dies or is cut off during that broadcast makes the whole call raise
``CommClosedError`` ("Scheduler Broadcast ... Stream is closed"), although
the scheduler kept the plugin for the workers that join later and the
others installed it. On a spot fleet a worker lost while the driver
installs its plugins failed the run at its start (seen on the namespaced
fleet, tests/integration/test_netfleet_chaos.py). :func:`register_surviving`
installs it again on the workers left, a few times. Guarded by
``tests/integration/test_plugin_broadcast.py``.
"""

from __future__ import annotations

import logging
import time

from distributed import Client
from distributed.comm.core import CommClosedError
from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["register_surviving"]

log = logging.getLogger(__name__)


def register_surviving(
    client: Client, plugin: WorkerPlugin, name: str | None = None, tries: int = 3
) -> None:
    """``client.register_plugin(plugin, name=name)``, again (up to ``tries`` calls in all)
    when a worker's connection closed during the broadcast.

    An idempotent plugin (``plugin.idempotent``) is not broadcast again: the
    scheduler has it, the workers that were reached have it, and a worker
    that joins later gets it when it registers.
    """
    for attempt in range(1, tries + 1):
        try:
            client.register_plugin(plugin, name=name)
            return
        except CommClosedError as exc:
            if attempt == tries:
                raise
            log.warning(
                "a worker left while plugin %s was installed (%s); installing it on the "
                "workers left",
                name or getattr(plugin, "name", type(plugin).__name__),
                " ".join(str(exc).split())[:200],
            )
            time.sleep(0.5 * attempt)

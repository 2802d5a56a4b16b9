"""Clean-up of the processes a test starts in their own process group."""

from __future__ import annotations

import contextlib
import os
import signal


def kill_group(pgid: int) -> None:
    """SIGKILL the whole process group (a driver and the cluster it started); gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)

"""A logging handler that keeps what it is given, for tests of what vcdl logs.

Attached to a named logger (``prefect``, ``distributed.client``) rather
than read through ``caplog``: distributed's loggers do not propagate to the
root logger.
"""

from __future__ import annotations

import logging


class RecordingHandler(logging.Handler):
    """Keeps every record at ``level`` or above in :attr:`records`."""

    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

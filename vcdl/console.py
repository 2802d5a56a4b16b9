"""Console log output that can never stall a run.

This module owns one thing: moving the writes of console log handlers off the
thread that logs. A console handler writes synchronously to stdout or stderr;
when those are a pipe nobody drains (a CLI piped into a stalled consumer, a
supervisor that reads only at the end), the 64 KiB pipe buffer fills and the
next write blocks. If the logging thread is the driver's Dask IO loop (the
nanny logs every worker restart there), no result reaches the driver any more
and the whole run hangs. This was seen in CI.

:func:`install` replaces every console handler (a ``StreamHandler`` writing to
a pipe, terminal or socket) on the root logger and on every existing logger with a
proxy. The proxy puts the record on a bounded queue and never waits. One
daemon thread hands the records to the original handlers, so only that thread
can block. When the queue is full, records are dropped and counted rather
than stalling the caller; once the console takes writes again, the writer
says how many were lost, on the same console, so a gap in a worker's log is
never silent. :meth:`ConsoleQueue.close` puts the original handlers back and
waits a bounded time for the queue to drain; :func:`close_and_report` then
names the drops after the last record, which no later record could announce
(at a worker's exit, too).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Records that may wait for a slow console before new ones are dropped.
DEFAULT_CAPACITY = 10_000
#: Seconds :meth:`ConsoleQueue.close` waits for the queue to drain.
DEFAULT_DRAIN = 5.0

_STOP = object()


def is_console(handler: logging.Handler) -> bool:
    """True for a handler that writes to a pipe, terminal or socket: a write that may block.

    A regular file or an in-memory stream (pytest's capture) is left alone.
    """
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    try:
        fd = handler.stream.fileno()
        return not stat.S_ISREG(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError):  # no descriptor, or a closed one
        return False


def _dropped(lost: int) -> logging.LogRecord:
    """The notice written where ``lost`` records went missing."""
    return logging.LogRecord(
        __name__,
        logging.WARNING,
        __file__,
        0,
        "%d log records were dropped here: the console (stdout/stderr) did not keep up",
        (lost,),
        None,
    )


class _Proxy(logging.Handler):
    """Stands in for one console handler: enqueues, never waits.

    Its level *is* the target's: records the target would ignore are not even
    queued, and whoever tames "the console handler" later (the CLI's quiet
    mode finds the proxy in its place) sets both.
    """

    def __init__(self, target: logging.Handler, owner: ConsoleQueue) -> None:
        self.target = target
        self.owner = owner
        super().__init__(level=target.level)

    @property
    def level(self) -> int:
        return self.target.level

    @level.setter
    def level(self, value: int) -> None:
        self.target.level = value

    def emit(self, record: logging.LogRecord) -> None:
        self.owner.put(self.target, record)


class ConsoleQueue:
    """The installed proxies, their queue and the thread that writes."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._queue: queue.Queue[tuple[logging.Handler, logging.LogRecord, int] | object] = (
            queue.Queue(capacity)
        )
        self._swapped: list[tuple[logging.Logger, logging.Handler, _Proxy]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.dropped = 0
        """Records dropped because the console did not keep up."""
        self.reported = 0
        """Of :attr:`dropped`, how many a queued record carries a notice of."""
        self._thread = threading.Thread(target=self._write, name="vcdl-console", daemon=True)
        self._thread.start()

    def put(self, target: logging.Handler, record: logging.LogRecord) -> None:
        with self._lock:  # put_nowait never waits: holding the lock costs nothing
            try:
                # The first record queued after a gap carries its size, so the
                # notice is written exactly where the records went missing.
                self._queue.put_nowait((target, record, self.dropped - self.reported))
            except queue.Full:
                self.dropped += 1
            else:
                self.reported = self.dropped

    def _write(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._closed.is_set():  # closed while the queue was full
                    return
                continue
            if item is _STOP:
                return
            assert isinstance(item, tuple)
            # The level was checked when the record was queued (the proxy's is
            # the target's); checking again here would drop records queued
            # before a level change.
            # Handler.handle applies the target's filters and reports its own
            # errors (handleError); nothing here may end the thread.
            target, record, lost = item
            with contextlib.suppress(Exception):
                if lost:
                    target.handle(_dropped(lost))
                target.handle(record)

    def swap(self, logger: logging.Logger) -> None:
        """Replace ``logger``'s console handlers with proxies."""
        for handler in list(logger.handlers):
            if isinstance(handler, _Proxy) or not is_console(handler):
                continue
            proxy = _Proxy(handler, self)  # formats nothing: the target does, in the thread
            index = logger.handlers.index(handler)
            logger.handlers[index] = proxy
            self._swapped.append((logger, handler, proxy))

    @property
    def pending(self) -> int:
        """Records queued that the console has not taken yet."""
        return self._queue.qsize()

    @property
    def handlers(self) -> int:
        """How many console handlers write through this queue."""
        return len(self._swapped)

    def close(self, drain: float = DEFAULT_DRAIN) -> bool:
        """Put the original handlers back; wait up to ``drain`` s for queued records.

        Returns True when every queued record was written. A console that is
        still blocked keeps the (daemon) writer thread; nothing else waits.
        """
        for logger, handler, proxy in self._swapped:
            if proxy in logger.handlers:
                logger.handlers[logger.handlers.index(proxy)] = handler
        self._swapped.clear()
        self._closed.set()
        try:
            self._queue.put(_STOP, timeout=drain)
        except queue.Full:
            return False
        self._thread.join(drain)
        return not self._thread.is_alive()


def _loggers() -> Iterator[logging.Logger]:
    yield logging.getLogger()
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):  # not a PlaceHolder
            yield logger


def install(capacity: int = DEFAULT_CAPACITY) -> ConsoleQueue:
    """Move every current console handler's writes to a background thread.

    Loggers created later propagate to the ones swapped here (Prefect and Dask
    attach their console handlers at import, before a run starts).
    """
    console = ConsoleQueue(capacity)
    for logger in _loggers():
        console.swap(logger)
    return console


def close_and_report(console: ConsoleQueue, drain: float = DEFAULT_DRAIN) -> bool:
    """:meth:`ConsoleQueue.close`, then name the drops no notice in the stream covers.

    Records dropped after the last one queued have no later record to carry
    their notice; they are counted on the restored console instead. Only when
    the queue drained: a console still blocked would block this write too.
    """
    drained = console.close(drain)
    lost = console.dropped - console.reported
    if drained and lost > 0:
        logging.getLogger(__name__).warning(
            "%d log records were dropped: the console (stdout/stderr) did not keep up", lost
        )
    return drained


@contextmanager
def console_off_thread(capacity: int = DEFAULT_CAPACITY) -> Iterator[ConsoleQueue]:
    """:func:`install` for the block; the handlers are restored after it."""
    console = install(capacity)
    try:
        yield console
    finally:
        close_and_report(console)


_process_console: ConsoleQueue | None = None


def install_for_process() -> ConsoleQueue:
    """:func:`install` once per process, closed at exit (a Dask worker's, for one)."""
    global _process_console
    if _process_console is None:
        _process_console = install()
        # A short drain: a worker being replaced must not linger on a stalled pipe.
        atexit.register(close_and_report, _process_console, 1.0)
    return _process_console

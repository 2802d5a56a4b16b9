"""vcdl.console: console handlers write from a background thread and never block the logger."""

from __future__ import annotations

import contextlib
import fcntl
import io
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from vcdl.console import (
    ConsoleQueue,
    close_and_report,
    console_off_thread,
    install,
    is_console,
)

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger(f"vcdl-test-console-{time.monotonic_ns()}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    yield log
    log.handlers.clear()


class PipeSink:
    """A console: a pipe whose far end a thread reads, so its writes never block."""

    def __init__(self) -> None:
        r, w = os.pipe()
        self.stream = os.fdopen(w, "w", buffering=1)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, args=(r,), daemon=True)
        self._reader.start()

    def _read(self, r: int) -> None:
        with os.fdopen(r, "rb", buffering=0) as f:
            while chunk := f.read(65536):
                self._chunks.append(chunk)

    def text(self) -> str:
        """Everything written; closes the pipe."""
        self.stream.close()
        self._reader.join(10)
        return b"".join(self._chunks).decode()


def _own(logger: logging.Logger) -> list[logging.Handler]:
    """The logger's handlers but pytest's capture (it adds its own to a non-propagating logger)."""
    return [h for h in logger.handlers if type(h).__name__ != "LogCaptureHandler"]


def _small_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)  # the smallest a pipe gets: it fills at once
    return r, w


class StalledConsole:
    """A console nobody reads until :meth:`read`: a 4 KiB pipe behind a ConsoleQueue.

    :meth:`finish` (the fixture calls it, pass or fail) reads the pipe, closes
    the queue and closes the stream only once the writer thread has ended: a
    stream closed under a live writer makes it report "I/O operation on closed
    file" from its thread while pytest renders the failure, which on CPython
    3.11.7 can crash pytest itself (gh-106905: two threads in ``ast.parse``).
    """

    def __init__(self, logger: logging.Logger, capacity: int, full: bool = False) -> None:
        self.r, w = _small_pipe()
        if full:  # already full: the writer's first write blocks
            os.set_blocking(w, False)
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(w, b"." * 512)
            os.set_blocking(w, True)
        self.stream = os.fdopen(w, "w", buffering=1)
        self.handler = logging.StreamHandler(self.stream)
        logger.addHandler(self.handler)
        self.logger = logger
        self.console = ConsoleQueue(capacity=capacity)
        self.console.swap(logger)
        self._chunks: list[bytes] = []
        self._reader: threading.Thread | None = None
        self._lines: list[str] | None = None

    def burst(self, n: int) -> None:
        for i in range(n):
            self.logger.warning("burst %04d %s", i, "x" * 90)

    def read(self) -> None:
        """Start reading the pipe (until the stream closes)."""
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _read(self) -> None:
        while chunk := os.read(self.r, 65536):
            self._chunks.append(chunk)

    def writer_ends(self, timeout: float = 30.0) -> bool:
        """Read, and wait for the writer thread to end (it ends once closed and drained)."""
        self.read()
        self.console._thread.join(timeout)
        return not self.console._thread.is_alive()

    def finish(self) -> list[str]:
        """Everything the console received, as lines; the pipe is closed. Idempotent."""
        if self._lines is not None:
            return self._lines
        self.read()  # first: a full queue takes close's stop only once the pipe moves
        self.console.close(drain=30)
        if not self.writer_ends():
            # Leave the stream open: a closed one would make the thread report from itself.
            pytest.fail(f"the console writer is still alive ({self.console.pending} queued)")
        self.logger.handlers.clear()
        self.stream.close()
        assert self._reader is not None
        self._reader.join(30)
        os.close(self.r)
        self._lines = b"".join(self._chunks).decode().splitlines()
        return self._lines


@pytest.fixture
def stalled(logger: logging.Logger) -> Iterator[Callable[..., StalledConsole]]:
    made: list[StalledConsole] = []

    def make(capacity: int, full: bool = False) -> StalledConsole:
        made.append(StalledConsole(logger, capacity, full))
        return made[-1]

    yield make
    for console in made:
        console.finish()


def test_a_blocked_console_never_blocks_the_logging_thread(
    stalled: Callable[..., StalledConsole],
) -> None:
    out = stalled(capacity=50)
    console, logger = out.console, out.logger
    assert console.handlers == 1 and out.handler not in logger.handlers
    t = time.perf_counter()
    for i in range(2000):  # ~200 KB: fifty times what the pipe holds
        logger.warning("record %04d %s", i, "x" * 90)
    took = time.perf_counter() - t
    # Without the proxy the first write past 4 KiB blocks forever.
    assert took < 5.0
    assert console.dropped > 0
    # The writer thread is stuck in the pipe: close gives up after its drain
    # time and still puts the original handler back.
    assert console.close(drain=0.2) is False
    assert _own(logger) == [out.handler]
    assert out.writer_ends()  # the blocked write finished once read


def test_records_reach_the_original_handler_in_order_and_format(logger: logging.Logger) -> None:
    out = PipeSink()
    handler = logging.StreamHandler(out.stream)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(message)s"))
    logger.addHandler(handler)
    with console_off_thread() as console:
        assert handler not in logger.handlers
        for i in range(100):
            logger.info("line %d", i)
    assert console.dropped == 0
    assert out.text().splitlines() == [f"INFO:line {i}" for i in range(100)]
    assert _own(logger) == [handler]


def test_the_original_level_is_honoured_and_follows_set_level(logger: logging.Logger) -> None:
    out = PipeSink()
    handler = logging.StreamHandler(out.stream)
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    console = install()
    (proxy,) = _own(logger)
    logger.info("dropped by level")
    logger.warning("kept")
    # Whoever quiets "the console handler" later finds the proxy: both change.
    proxy.setLevel(logging.ERROR)
    assert handler.level == logging.ERROR
    logger.warning("now below the level")
    logger.error("kept too")
    assert console.close() is True
    assert out.text().splitlines() == ["kept", "kept too"]


def test_files_and_other_handlers_are_left_alone(
    logger: logging.Logger, tmp_path: os.PathLike[str]
) -> None:
    file_handler = logging.FileHandler(os.path.join(tmp_path, "log.txt"))
    null = logging.NullHandler()
    memory = logging.StreamHandler(io.StringIO())  # pytest's capture is one
    for h in (file_handler, null, memory):
        logger.addHandler(h)
    assert not any(is_console(h) for h in (file_handler, null, memory))
    pipe = PipeSink()
    assert is_console(logging.StreamHandler(pipe.stream))
    console = ConsoleQueue()
    console.swap(logger)
    assert console.handlers == 0 and _own(logger) == [file_handler, null, memory]
    pipe.text()
    console.close()
    file_handler.close()


def test_a_logger_made_later_writes_through_its_swapped_parent(logger: logging.Logger) -> None:
    out = PipeSink()
    logger.addHandler(logging.StreamHandler(out.stream))
    with console_off_thread():
        child = logging.getLogger(logger.name + ".child-made-later")
        child.warning("from the child")
        writer = threading.current_thread()
        seen: list[threading.Thread] = []

        class Spy(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(threading.current_thread())

        # The proxy installed for the parent hands the record to another thread.
        spy = Spy()
        (proxy,) = _own(logger)
        proxy.target = spy  # type: ignore[attr-defined]
        child.warning("who writes this?")
    assert "from the child" in out.text()
    assert seen and seen[0] is not writer


def test_a_second_install_does_not_wrap_a_proxy(logger: logging.Logger) -> None:
    out = PipeSink()
    logger.addHandler(logging.StreamHandler(out.stream))
    outer = install()
    inner = install()
    assert not any(lg is logger for lg, _, _ in inner._swapped)
    logger.warning("once")
    inner.close()
    outer.close()
    assert out.text() == "once\n"


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        ConsoleQueue(capacity=0)


def test_the_console_is_told_where_records_were_dropped(
    stalled: Callable[..., StalledConsole],
) -> None:
    out = stalled(capacity=20)
    out.burst(500)  # the pipe and the queue fill: most of these are dropped
    console = out.console
    dropped = console.dropped
    assert dropped > 0
    out.read()  # the console is read again
    # Log again only once there is room: a record dropped here would leave the
    # burst's last gap with nothing after it to carry its notice.
    deadline = time.monotonic() + 30
    while console.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert console.pending == 0, "the console was read but its queue did not drain in 30 s"
    out.logger.warning("after the gap")
    assert console.close(drain=30) is True
    lines = out.finish()

    # The writer may drain a little while the burst still runs, so the burst can
    # have several gaps; each must be announced exactly where it is, with its size.
    def number(line: str) -> int | None:  # a record's place in the sequence; None for a notice
        if line.startswith("burst"):
            return int(line.split()[1])
        return 500 if line == "after the gap" else None

    seen = [number(line) for line in lines]
    announced = 0
    for i, line in enumerate(lines):
        if m := re.search(r"(\d+) log records were dropped here", line):
            before, after = seen[i - 1], seen[i + 1]
            assert before is not None and after is not None, lines[i - 1 : i + 2]
            assert after - before - 1 == int(m[1]), lines[i - 1 : i + 2]
            announced += int(m[1])
    assert announced == dropped
    burst = [line for line in lines if line.startswith("burst")]
    assert len(burst) + dropped == 500
    # No gap goes unannounced: consecutive records are consecutive numbers.
    numbers = [n for n in seen if n is not None]
    gaps = sum(b - a - 1 for a, b in itertools.pairwise(numbers))
    assert gaps == dropped and numbers[-1] == 500
    assert console.dropped == console.reported == dropped


def test_drops_after_the_last_record_are_counted_at_close(
    stalled: Callable[..., StalledConsole],
) -> None:
    # The pipe full from the start: the writer blocks on its first record, so the
    # queue fills and stays full. A pipe with room let the writer, slower than
    # the burst, free a slot late in it, and the last record was queued (CI,
    # 2026-11-30: 467 dropped, all of them announced, 17 queued).
    out = stalled(capacity=20, full=True)
    console = out.console
    notices = logging.getLogger("vcdl.console")  # where close_and_report speaks
    notices.addHandler(out.handler)
    try:
        out.burst(500)  # nobody reads: the queue fills behind the blocked writer
        tail = console.dropped - console.reported
        # The burst ends in a gap no later record can announce.
        assert tail > 0, (console.dropped, console.reported, console.pending)
        out.read()
        assert close_and_report(console, drain=30) is True
    finally:
        notices.removeHandler(out.handler)
    lines = out.finish()
    assert lines[-1].startswith(f"{tail} log records were dropped: "), lines[-2:]
    in_stream = sum(int(m[1]) for line in lines if (m := re.match(r"(\d+) log records", line)))
    assert in_stream == console.dropped  # every drop is named once, the tail included


def test_a_console_still_blocked_at_close_is_not_written_to(
    stalled: Callable[..., StalledConsole], caplog: pytest.LogCaptureFixture
) -> None:
    out = stalled(capacity=5, full=True)
    out.burst(200)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="vcdl.console"):
        assert close_and_report(out.console, drain=0.2) is False
    assert time.perf_counter() - started < 5  # bounded: a stalled pipe does not hold the exit
    assert "were dropped" not in caplog.text  # that write would block as well
    # The fixture then reads the pipe and lets the writer end before closing it.

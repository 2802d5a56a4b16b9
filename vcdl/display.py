"""What ``vcdl train`` and ``vcdl resume`` write to the terminal while the run trains.

Two jobs at the edge of the CLI, both kept off the driver's threads:

* :class:`RunLog` sends the process's file descriptor 2, and so everything
  Prefect, Dask, the worker processes and the Prefect server write to
  stderr, to the run's log file ``<home>/logs/<run>.log`` for the block; the
  terminal stays reachable through :attr:`RunLog.terminal`. A regular file
  takes writes without blocking, so no console can stall the driver. A log
  whose disk fills mid-run loses its tail, not the run: the writers drop
  what fails, and the run's end says so in one line on the terminal.
* :class:`Display` shows the run on that terminal: in a terminal a live
  rich display (progress bar of the epoch's shards, head, latest metrics,
  kills/reissues/rejections, elapsed and time left) with warnings and errors
  printed above it; elsewhere (a pipe, a CI log) plain lines at a steady
  pace, without control characters. With ``-v`` the log file's lines are
  shown as well.

The state shown is :class:`vcdl.views.live.LiveModel`'s, fed by the
driver's in-process events (:mod:`vcdl.views.observe`). The driver's side
(the listener, the log handler) only records and returns; one daemon
thread writes, and is the only one a stalled terminal can block.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TextIO

from vcdl.views.live import (
    LiveFields,
    LiveModel,
    PlainPacer,
    counts_text,
    plain_line,
    time_text,
)
from vcdl.views.observe import RunEvent

#: Seconds between renders of the live display.
LIVE_REFRESH = 0.25
#: Messages (warnings, -v log lines) that may wait for a slow terminal before new ones drop.
CAPACITY = 2000

# CSI/OSC escape sequences, then any other control character but tab.
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|.)")
_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def plain(text: str) -> str:
    """``text`` without escape sequences or control characters (one line)."""
    return _CONTROLS.sub(" ", _ESCAPES.sub("", text))


def check_run_log(path: Path) -> None:
    """Refuse a run log vcdl cannot append to, in one line (:class:`ConfigError`, exit 2).

    A folder where the log would be, a file where its folder would be, a FIFO
    or a file or folder without write permission: said before anything of
    the run is written (it was a traceback once the run had started). Writes nothing.
    """
    import stat

    from vcdl.errors import ConfigError

    there = path.parent
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    problem, culprit = None, path
    if not there.is_dir():
        culprit = there
        problem = f"{there} is a file, not a folder"
    elif os.path.lexists(path):
        try:
            mode = path.stat().st_mode
            if stat.S_ISDIR(mode):
                problem = "it is a folder"
            elif not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
                problem = "it is not a regular file"
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        except OSError as exc:
            problem = f"it cannot be written ({exc.strerror})"
    elif not os.access(there, os.W_OK | os.X_OK):
        problem, culprit = f"{there} cannot be written", there
    if problem is not None:
        todo = "move it out of the way" if culprit == path else f"move {culprit} out of the way"
        raise ConfigError(f"the run's log {path}: {problem}; {todo}, or pass another --home")


def _append(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` whole, or raise the OSError that stopped it (a short
    write on a disk that just filled is written on until the disk says so)."""
    data = memoryview(text.encode())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class RunLog:
    """File descriptor 2 goes to ``path`` (appended) for the block; the terminal is kept.

    The log's disk full at the start is :class:`~vcdl.errors.DiskFull` (exit 2, before
    the run); full by the end, the block ends saying so on the terminal
    (:attr:`cut_short`) and the run's outcome stands: its state is in the ledger
    and the store, not in its log.
    """

    def __init__(self, path: Path, header: str) -> None:
        self.path, self.header = path, header
        self._saved: int | None = None
        self.terminal: TextIO = sys.stderr
        self.start_offset = 0
        self.keep_terminal = False
        """Set when a writer may still be blocked on the terminal: it is left open then."""
        self.cut_short: str | None = None
        """Why the log lost its tail (its disk filled), once the block has ended."""

    def __enter__(self) -> RunLog:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            self._full(exc)
            raise
        try:
            _append(self.path, f"=== {self.header} at {_stamp()} (pid {os.getpid()}) ===\n")
            self.start_offset = os.fstat(fd).st_size
            sys.stderr.flush()
            self._saved = os.dup(2)
            os.dup2(fd, 2)
        except OSError as exc:
            self._full(exc)
            raise
        finally:
            os.close(fd)
        # Its own descriptor: closing it never closes the saved one.
        self.terminal = os.fdopen(
            os.dup(self._saved), "w", buffering=1, encoding="utf-8", errors="replace"
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None
        # The log's last line: where the disk filled, the one write that tells.
        try:
            _append(self.path, f"=== {self.header} ended at {_stamp()} ===\n")
        except OSError as exc:
            self.cut_short = _full_reason(exc)
        if self.cut_short is not None:
            with contextlib.suppress(Exception):
                print(
                    f"vcdl: warning: the run's log {self.path} is cut short: its disk is full "
                    f"({self.cut_short}); free space on it for the next run's log (the run's "
                    "state is in its ledger and store, not in its log)",
                    file=sys.stderr,
                    flush=True,
                )
        if not self.keep_terminal:
            with contextlib.suppress(Exception):
                self.terminal.close()
        self.terminal = sys.stderr

    def _full(self, exc: OSError) -> None:
        """Raise :class:`~vcdl.errors.DiskFull` for a log that cannot start on a full disk."""
        from vcdl.errors import DiskFull

        reason = _full_reason(exc)
        if reason is not None:
            raise DiskFull(
                f"the run's log {self.path}: its disk is full ({reason}); free space on it, "
                "or pass another --home"
            ) from None


def _full_reason(exc: OSError) -> str | None:
    """``exc``'s words when it says the disk (or a quota) is full, else None."""
    import errno

    if exc.errno == errno.ENOSPC:
        return "no space left on device"
    if exc.errno == errno.EDQUOT:
        return "disk quota exceeded"
    return None


class _Tail(threading.Thread):
    """Hands each new line of a file to ``emit`` (``-v``: the log shown as it grows)."""

    def __init__(self, path: Path, offset: int, emit: Any) -> None:
        super().__init__(name="vcdl-log-tail", daemon=True)
        self.path, self.offset, self.emit = path, offset, emit
        self.stopped = threading.Event()

    def run(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            partial = b""
            while True:
                stopping = self.stopped.is_set()  # read once more after the stop
                chunk = f.read()
                if chunk:
                    *lines, partial = (partial + chunk).split(b"\n")
                    for line in lines:
                        self.emit(line.decode("utf-8", "replace"))
                if stopping:
                    if partial:
                        self.emit(partial.decode("utf-8", "replace"))
                    return
                self.stopped.wait(0.2)


class _Handler(logging.Handler):
    """Warnings and errors of the driver's process, queued for the display; never waits."""

    def __init__(self, display: Display) -> None:
        super().__init__(logging.WARNING)
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                text += f" ({type(exc).__name__}: {exc}; the traceback is in the log)"
        except Exception:
            return
        level = record.levelname.lower()
        self.display.message(f"{level}: {text}", "red" if record.levelno >= 40 else "yellow")


class Display:
    """The run's progress on ``out``: live (a terminal) or plain lines; see the module doc."""

    def __init__(
        self,
        out: TextIO,
        live: bool,
        run: str = "",
        started: float | None = None,
        warnings: bool = True,
        plain_interval: float = 5.0,
    ) -> None:
        self.out, self.live = out, live
        self.model = LiveModel(started=time.monotonic() if started is None else started, run=run)
        self.pacer = PlainPacer(interval=plain_interval)
        self._lock = threading.Lock()
        self._milestone = False
        self._messages: queue.Queue[tuple[str, str]] = queue.Queue(CAPACITY)
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vcdl-display", daemon=True)
        self._handler = _Handler(self) if warnings else None
        self._tail: _Tail | None = None
        self._live: Any = None
        self.renders = 0
        self.stuck = False
        """True when the writer did not stop in time (a terminal that does not take writes)."""

    # -- the driver's side: record and return -------------------------------------------

    def listen(self, event: RunEvent) -> None:
        """A :mod:`vcdl.views.observe` listener."""
        with self._lock:
            if self.model.handle(event, time.monotonic()):
                self._milestone = True

    def message(self, text: str, style: str = "") -> None:
        """A line to print above the display (or between plain lines)."""
        try:
            self._messages.put_nowait((text, style))
        except queue.Full:
            self.dropped += 1

    def show_log(self, path: Path, offset: int) -> None:
        """Show the lines written to ``path`` from ``offset`` on (``-v``)."""
        self._tail = _Tail(path, offset, lambda line: self.message(line, "dim"))

    # -- the writer thread ----------------------------------------------------------------

    def __enter__(self) -> Display:
        if self._handler is not None:
            logging.getLogger().addHandler(self._handler)
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.out, force_terminal=True, highlight=False)
            self._live = Live(
                console=console,
                auto_refresh=False,
                redirect_stdout=False,  # the driver's writes never go through the terminal
                redirect_stderr=False,
                transient=False,
            )
        if self._tail is not None:
            self._tail.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
        if self._tail is not None:
            self._tail.stopped.set()
            self._tail.join(2.0)
        self._stop.set()
        # A terminal that blocks keeps the (daemon) writer; the run is over anyway.
        self._thread.join(5.0)
        self.stuck = self._thread.is_alive()

    def _fields(self) -> tuple[LiveFields, bool]:
        with self._lock:
            milestone, self._milestone = self._milestone, False
            return self.model.fields(time.monotonic()), milestone

    def _drain(self) -> None:
        while True:
            try:
                text, style = self._messages.get_nowait()
            except queue.Empty:
                return
            self._write_message(text, style)

    def _write_message(self, text: str, style: str) -> None:
        if self._live is not None:
            from rich.text import Text

            self._live.console.print(Text(plain(text), style=style))
        else:
            self.out.write(plain(text) + "\n")
            self.out.flush()

    def _loop(self) -> None:
        try:
            if self._live is not None:
                self._live.start()
            while True:
                stopping = self._stop.wait(LIVE_REFRESH if self._live is not None else 0.5)
                self._drain()
                fields, milestone = self._fields()
                self._render(fields, milestone, last=stopping)
                if stopping:
                    break
            if self.dropped:
                self._write_message(
                    f"warning: {self.dropped} messages were not shown: the terminal did not "
                    "keep up (the log file has them all)",
                    "yellow",
                )
        except Exception:
            return
        finally:
            if self._live is not None:
                with contextlib.suppress(Exception):
                    self._live.stop()

    def _render(self, f: LiveFields, milestone: bool, last: bool = False) -> None:
        if self._live is not None:
            self._live.update(render(f), refresh=True)
            self.renders += 1
        elif self.pacer.due(f, time.monotonic(), milestone, last):
            self.out.write(plain(plain_line(f)) + "\n")
            self.out.flush()
            self.renders += 1


_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def render(f: LiveFields) -> Any:
    """The live display's renderable (rich) for ``f``."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    # The spinner's frame follows the clock: each render is built afresh.
    spin = Text(_FRAMES[int(f.elapsed * 8) % len(_FRAMES)], style="cyan")
    if f.epoch is None:
        return Group(
            Text.assemble(spin, (f" run {f.run}: starting Prefect and the cluster", "bold")),
            Text(f"  {time_text(f)}", style="dim"),
        )
    top = Table.grid(padding=(0, 1))
    top.add_column()
    top.add_column(no_wrap=True)
    top.add_column(width=30)
    top.add_column(no_wrap=True)
    head = f"v{f.head_version}" if f.head_version is not None else "-"
    top.add_row(
        Text("✓", style="green") if f.finished else spin,
        Text(f"epoch {f.epoch + 1}/{f.epochs}", style="bold"),
        ProgressBar(total=max(f.shards, 1), completed=f.done, width=30),
        Text.assemble((f"{f.done}/{f.shards}", "bold"), " shards · head ", (head, "magenta")),
    )
    metrics = Text.assemble("  test ", (f.metrics or "-", "green"))
    tally = Text(f"  {counts_text(f)}", style="yellow" if f.kills or f.rejections else "")
    clock = Text(f"  {time_text(f)}", style="dim")
    return Group(top, metrics, tally, clock)


def out_is_terminal(out: IO[str]) -> bool:
    """Whether ``out`` gets the live display: a terminal that understands escapes."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"

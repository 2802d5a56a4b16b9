"""The driver's Prometheus endpoint: its registry, its collector, its HTTP server.

A run started with ``[metrics] port`` (or ``--metrics-port``) serves
``http://ADDRESS:PORT/metrics`` while its driver runs (:func:`serve_metrics`,
around the ``vcdl-train`` flow). The endpoint has a registry of its own
(never prometheus_client's global one, which Prefect or user code may fill)
holding one :class:`RunCollector`. At a scrape the collector reads the run's
rows from the ledger (at most once per :data:`MIN_REFRESH_SECONDS`, or ten
times as long as the last read took) and
renders :func:`vcdl.metrics.figures.ledger_figures`: every ledger-backed
number is the ledger's own. Two things the ledger does not keep are counted
from the driver's events as they happen: preemption notices (a partial result
or a hand-back, :func:`note_event`) and the attempts the driver gave up on
(:func:`note_kill`; a killed attempt may later record its real end, so the
ledger's count of killed attempts can fall).

Every metric is named ``vcdl_*`` and labelled with the run; docs/metrics.md
lists them.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from vcdl.config import MetricsSection, RunConfig
from vcdl.driver.epoch_events import Event, TaskReturned
from vcdl.errors import ConfigError
from vcdl.metrics.figures import Figures, Histogram, ledger_figures
from vcdl.runtime import RunRef
from vcdl.views.prices import PriceTable, run_prices

log = logging.getLogger(__name__)

MIN_REFRESH_SECONDS = 1.0
"""Scrapes closer together than this share one read of the ledger."""

READ_SHARE = 10.0
"""Reads are at least this many times their own duration apart: a big run's scrapes
share reads rather than spend more than a tenth of the driver's time on them."""

NOTICE_RESPONSES = ("interrupted", "handed_back")
"""What a worker under a preemption notice did: stopped with a partial result, or took
no attempt and handed the task back."""


class RunCollector(Collector):
    """The metrics of one run: the ledger's figures and the driver's event counts."""

    def __init__(self, run: str, min_refresh: float = MIN_REFRESH_SECONDS) -> None:
        self.run = run
        self.min_refresh = min_refresh
        self.url = ""
        """Where it is served (set by :func:`serve_metrics`)."""
        self._lock = threading.Lock()  # the fields below; held briefly
        self._read = threading.Lock()  # one read of the ledger at a time
        self._ref: RunRef | None = None
        self._cfg: RunConfig | None = None
        self._prices: PriceTable | None = None
        self._figures: Figures | None = None
        self._read_at = -float("inf")
        self._read_seconds = 0.0
        self._read_errors = 0
        self._ended = False
        self.final_read = threading.Event()
        """Set once a scrape has read the ledger after :meth:`end`."""
        self.notices = dict.fromkeys(NOTICE_RESPONSES, 0)
        self.kills = {"killed": 0, "timeout": 0}

    def follow(self, ref: RunRef, cfg: RunConfig) -> None:
        """Read this run's rows from now on (once the run exists in the ledger)."""
        try:
            prices = run_prices(cfg.cost)
        except Exception:  # no spend figure beats no metrics; the run checked them itself
            prices = None
        with self._lock:
            self._ref, self._cfg, self._prices = ref, cfg, prices
            self._read_at = -float("inf")

    def note_event(self, event: Event) -> None:
        """Count a driver event the ledger does not keep (a preemption notice's answer)."""
        if isinstance(event, TaskReturned) and event.kind in NOTICE_RESPONSES:
            with self._lock:
                self.notices[event.kind] += 1

    def note_kill(self, state: str) -> None:
        """Count an attempt the driver recorded as given up on ("killed" or "timeout")."""
        with self._lock:
            self.kills[state] = self.kills.get(state, 0) + 1

    @property
    def following(self) -> bool:
        """Whether :meth:`follow` named the run (it exists in the ledger)."""
        with self._lock:
            return self._ref is not None

    def end(self) -> None:
        """The run has ended: the next scrape reads the ledger again, whatever its age."""
        with self._lock:
            self._ended = True
            self._read_at = -float("inf")

    def figures(self) -> Figures | None:
        """The run's figures, read again if the last read is older than ``min_refresh``.

        One read at a time (``_read``), and never under ``_lock``: the driver's
        :meth:`note_event` must not wait for a scrape's read of the ledger.
        """
        with self._read:
            with self._lock:
                ref, cfg, prices, ended = self._ref, self._cfg, self._prices, self._ended
                # A read costs the driver's process time (about 1 s at 10 000
                # attempts, benchmarks/metrics_read.py): at most a tenth of it.
                spacing = max(self.min_refresh, READ_SHARE * self._read_seconds)
                fresh = time.monotonic() - self._read_at < spacing
                if ref is None or cfg is None or fresh:
                    if ended and fresh:
                        self.final_read.set()
                    return self._figures
            started = time.perf_counter()
            try:
                figures = read_figures(ref, cfg, prices)
            except Exception as exc:  # a scrape must not fail the run, nor the scrape
                figures = None
                log.warning("metrics: could not read the ledger (%s: %s)", type(exc).__name__, exc)
            with self._lock:
                if figures is not None:
                    self._figures = figures
                else:
                    self._read_errors += 1
                self._read_seconds = time.perf_counter() - started
                # A read the end overtook is stale at once: the next scrape reads again.
                self._read_at = time.monotonic() if ended == self._ended else -float("inf")
                if ended:  # this read began after the run ended: its final figures
                    self.final_read.set()
                return self._figures

    def collect(self) -> Iterator[Metric]:
        figures = self.figures()
        with self._lock:
            notices, kills = dict(self.notices), dict(self.kills)
            read_seconds, read_errors = self._read_seconds, self._read_errors
        yield from families(self.run, figures, notices, kills)
        yield _gauge(
            "vcdl_ledger_read_seconds",
            "Seconds the last read of the ledger took.",
            self.run,
            read_seconds,
        )
        c = CounterMetricFamily(
            "vcdl_ledger_read_errors",
            "Reads of the ledger for metrics that failed.",
            labels=["run"],
        )
        c.add_metric([self.run], read_errors)
        yield c

    def describe(self) -> Iterator[Metric]:
        """Every family this collector exports, without samples."""
        yield from families(self.run, None, {}, {})
        yield GaugeMetricFamily("vcdl_ledger_read_seconds", "", labels=["run"])
        yield CounterMetricFamily("vcdl_ledger_read_errors", "", labels=["run"])


def read_figures(ref: RunRef, cfg: RunConfig, prices: PriceTable | None) -> Figures:
    """One read of the run's rows, as :class:`Figures`."""
    ledger = ref.ledger()
    run = ledger.get_run(ref.run)
    return ledger_figures(
        run,
        cfg.run.epochs,
        ledger.subtasks(ref.run),
        ledger.attempts(ref.run),
        ledger.versions(ref.run),
        ledger.evaluations(ref.run),
        prices,
        now=datetime.now(UTC),
        instance_type=cfg.cost.instance_type,
        worker_types=cfg.cost.worker_types,
    )


def _gauge(name: str, doc: str, run: str, value: float | None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["run"])
    if value is not None:
        g.add_metric([run], value)
    return g


def _histograms(
    name: str, doc: str, run: str, by: str, hists: dict[str, Histogram]
) -> HistogramMetricFamily:
    h = HistogramMetricFamily(name, doc, labels=["run", by])
    for key, hist in hists.items():
        h.add_metric([run, key], hist.buckets(), hist.total)
    return h


def families(
    run: str,
    f: Figures | None,
    notices: dict[str, int],
    kills: dict[str, int],
) -> Iterator[Metric]:
    """The metric families of a run; without ``f`` (no read yet) the ledger's are empty."""
    counters: list[tuple[str, str, str | None, dict[str, float]]] = [
        (
            "vcdl_attempts_started",
            "Attempts the ledger holds (each a shard trained once on one worker).",
            None,
            {"": f.attempts_started} if f else {},
        ),
        (
            "vcdl_attempts",
            "Attempts by final outcome: merged, rejected, duplicate, failed.",
            "outcome",
            dict(f.outcomes) if f else {},
        ),
        ("vcdl_merges", "Results merged into a new version.", None, {"": f.merges} if f else {}),
        (
            "vcdl_reissues",
            "Further attempts of subtasks beyond their first.",
            None,
            {"": f.reissues} if f else {},
        ),
        (
            "vcdl_rejections",
            "Results rejected, by class of reason.",
            "reason",
            dict(f.rejections) if f else {},
        ),
        (
            "vcdl_preemption_notices",
            "Answers to preemption notices seen by this driver: a partial result "
            "(interrupted) or a task handed back untrained (one notice may hand back several).",
            "response",
            dict(notices),
        ),
        (
            "vcdl_kills",
            "Attempts this driver gave up on (worker died: killed; past its deadline: timeout).",
            "how",
            dict(kills),
        ),
    ]
    for name, doc, label, values in counters:
        c = CounterMetricFamily(name, doc, labels=["run"] + ([label] if label else []))
        for key, value in values.items():
            c.add_metric([run] + ([key] if label else []), value)
        yield c

    state = GaugeMetricFamily(
        "vcdl_attempts_in_state", "Attempts in each ledger state now.", labels=["run", "state"]
    )
    for key, n in (f.attempts_by_state if f else {}).items():
        state.add_metric([run, key], n)
    yield state
    info = GaugeMetricFamily("vcdl_run_state", "1 for the run's state.", labels=["run", "state"])
    if f:
        info.add_metric([run, f.state], 1)
    yield info

    yield _gauge(
        "vcdl_head_version", "The head version's number.", run, f.head_version if f else None
    )
    yield _gauge("vcdl_epochs", "Epochs the run trains.", run, f.epochs if f else None)
    yield _gauge(
        "vcdl_epochs_completed",
        "Epochs past their barrier.",
        run,
        f.epochs_completed if f else None,
    )
    yield _gauge(
        "vcdl_goodput",
        "Share of training seconds that reached a merged version.",
        run,
        f.goodput if f else None,
    )
    yield _gauge(
        "vcdl_training_seconds",
        "Seconds attempts trained, all of them.",
        run,
        f.train_seconds if f else None,
    )
    yield _gauge(
        "vcdl_spend_usd",
        "Spot cost of every attempt so far (running ones up to now), USD.",
        run,
        f.spend_usd if f else None,
    )
    yield _gauge(
        "vcdl_waste_usd",
        "Spot cost of attempts that will never be merged, USD.",
        run,
        f.waste_usd if f else None,
    )
    ev = GaugeMetricFamily(
        "vcdl_eval_metric",
        "The objective's metrics of the latest test evaluation.",
        labels=["run", "metric"],
    )
    for key, value in (f.evaluation if f else {}).items():
        ev.add_metric([run, key], value)
    yield ev
    yield _gauge(
        "vcdl_eval_version",
        "The version the latest test evaluation scored.",
        run,
        f.evaluation_version if f else None,
    )

    staleness = HistogramMetricFamily(
        "vcdl_staleness", "Staleness of merged results (versions).", labels=["run"]
    )
    merge = HistogramMetricFamily(
        "vcdl_merge_seconds", "Seconds the assimilator took per merged result.", labels=["run"]
    )
    if f:
        staleness.add_metric([run], f.staleness.buckets(), f.staleness.total)
        merge.add_metric([run], f.merge_seconds.buckets(), f.merge_seconds.total)
    yield staleness
    yield merge
    yield _histograms(
        "vcdl_attempt_phase_seconds",
        "Seconds per phase of ended attempts (worker: claim, read, data, train, write, "
        "record; driver: queued, memory_wait, scheduling, prefect).",
        run,
        "phase",
        dict(f.attempt_phases) if f else {},
    )
    yield _histograms(
        "vcdl_merge_phase_seconds",
        "Seconds per phase of the assimilator (read_result, read_head, merge, "
        "write_version, ledger).",
        run,
        "phase",
        dict(f.merge_phases) if f else {},
    )


# The collectors of the runs this process drives now, by run name.
_ACTIVE: dict[str, RunCollector] = {}


def active(run: str) -> RunCollector | None:
    """The collector of ``run`` if this process serves its metrics."""
    return _ACTIVE.get(run)


def follow_run(ref: RunRef, cfg: RunConfig) -> None:
    """Start reading the run's rows (call once the run exists in the ledger)."""
    collector = _ACTIVE.get(ref.run)
    if collector is not None:
        collector.follow(ref, cfg)


def note_event(run: str, event: Event) -> None:
    """Count a driver event for ``run``'s metrics, if they are served."""
    collector = _ACTIVE.get(run)
    if collector is not None:
        collector.note_event(event)


def note_kill(run: str, state: str) -> None:
    """Count an attempt of ``run`` the driver recorded as killed or timed out."""
    collector = _ACTIVE.get(run)
    if collector is not None:
        collector.note_kill(state)


def _cannot_listen(section: MetricsSection, exc: OSError) -> ConfigError:
    return ConfigError(
        f"metrics endpoint {section.address}:{section.port} cannot listen "
        f"({exc.strerror or exc}); choose another port (--metrics-port or metrics.port)"
    )


def check_endpoint(section: MetricsSection) -> None:
    """Raise :class:`~vcdl.errors.ConfigError` if the endpoint could not listen now.

    A preflight (vcdl.api.preflight): binds and closes at once, as the
    server binds (``SO_REUSEADDR``: a port a finished run left in TIME_WAIT
    is free). :func:`serve_metrics` binds again and says the same if the
    port was taken in between.
    """
    if section.port is None:
        return
    try:
        infos = socket.getaddrinfo(
            section.address, section.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, where = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
    except OSError as exc:
        raise _cannot_listen(section, exc) from None


@contextmanager
def serve_metrics(section: MetricsSection, run: str) -> Iterator[RunCollector | None]:
    """Serve ``run``'s metrics on ``section``'s port while the body runs (none without one).

    With ``section.linger``, waits after the body (at most that long) for one
    scrape that reads the run's final figures. Binds before the body: a port
    in use (or an address that is not this machine's) is a
    :class:`~vcdl.errors.ConfigError`, before anything of the run is written.
    """
    if section.port is None:
        yield None
        return
    registry = CollectorRegistry(auto_describe=False)
    collector = RunCollector(run)
    host = f"[{section.address}]" if ":" in section.address else section.address
    collector.url = f"http://{host}:{section.port}/metrics"
    registry.register(collector)
    try:
        server, thread = start_http_server(section.port, section.address, registry)
    except OSError as exc:
        raise _cannot_listen(section, exc) from None
    _ACTIVE[run] = collector
    log.info("metrics of run %s at %s", run, collector.url)
    interrupted = False
    try:
        yield collector
    except BaseException as exc:
        interrupted = not isinstance(exc, Exception)  # Ctrl-C, exit: do not keep them waiting
        raise
    finally:
        _ACTIVE.pop(run, None)
        if section.linger > 0 and collector.following and not interrupted:
            # Prometheus scrapes every so often: without this, a run's last
            # seconds (its last merges, its state) would never be scraped.
            collector.end()
            if collector.final_read.wait(section.linger):
                time.sleep(0.2)  # let the response that read the end go out
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

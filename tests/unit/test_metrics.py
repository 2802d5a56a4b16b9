"""The metrics' figures from ledger rows, their rendering, and the endpoint's own rules."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port
from vcdl.config import MetricsSection, parse_config
from vcdl.driver.epoch_events import TaskReturned
from vcdl.errors import ConfigError
from vcdl.ledger import Attempt, Evaluation, Run, Subtask, Version
from vcdl.metrics.exporter import RunCollector, check_endpoint, families, serve_metrics
from vcdl.metrics.figures import (
    FINAL_OUTCOMES,
    REJECTION_CLASSES,
    Histogram,
    ledger_figures,
    rejection_class,
)
from vcdl.states import ATTEMPT_MOVES
from vcdl.views.prices import load_prices

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _attempt(i: int, state: str, **kw: object) -> Attempt:
    fields: dict[str, object] = {
        "id": f"a{i}",
        "run": "r",
        "subtask_id": i,
        "epoch": 0,
        "shard": i,
        "number": 1,
        "worker": "tcp://w:1",
        "base_version": 0,
        "state": state,
        "started_at": T0,
        "finished_at": T0 + timedelta(seconds=10),
        "train_seconds": 8.0,
    }
    fields.update(kw)
    return Attempt(**fields)


def _rows() -> tuple[Run, list[Subtask], list[Attempt], list[Version], list[Evaluation]]:
    run = Run(name="r", config="{}", state="running", head_version=2, epochs_completed=0)
    subtasks = [
        Subtask(id=1, run="r", epoch=0, shard=0, state="merged", attempts=1),
        Subtask(id=2, run="r", epoch=0, shard=1, state="merged", attempts=3),
        Subtask(id=3, run="r", epoch=0, shard=2, state="running", attempts=2),
    ]
    timing = {
        "read": 0.1,
        "train": 7.5,
        "write": 0.2,
        "assimilator_merge": 0.3,
        "assimilator_ledger": 0.01,
        "checkpoint_failures": 2,
    }
    attempts = [
        _attempt(1, "merged", timings=json.dumps(timing)),
        _attempt(2, "killed", shard=1, subtask_id=2),
        _attempt(
            3,
            "rejected",
            shard=1,
            subtask_id=2,
            number=2,
            reason="stale: staleness 9 > 4",
            timings=json.dumps({"read": 0.1, "assimilator_read_result": 0.05}),
        ),
        _attempt(4, "merged", shard=1, subtask_id=2, number=3, timings=json.dumps(timing)),
        _attempt(
            5,
            "running",
            shard=2,
            subtask_id=3,
            finished_at=None,
            train_seconds=None,
            timings=json.dumps({"read": 99.0}),
        ),
        _attempt(
            6,
            "rejected",
            shard=2,
            subtask_id=3,
            number=2,
            reason="bad report from the worker: loss nan is not finite",
        ),
    ]
    versions = [
        Version(run="r", number=0, uri="v0", checksum="c"),
        Version(
            run="r",
            number=1,
            subtask_id=1,
            attempt_id="a1",
            epoch=0,
            staleness=0,
            uri="v1",
            checksum="c",
        ),
        Version(
            run="r",
            number=2,
            subtask_id=2,
            attempt_id="a4",
            epoch=0,
            staleness=3,
            uri="v2",
            checksum="c",
        ),
    ]
    evals = [
        Evaluation(
            id=1, run="r", version=0, epoch=None, split="test", loss=2.3, samples=10, accuracy=0.1
        ),
        Evaluation(
            id=2,
            run="r",
            version=2,
            epoch=0,
            split="test",
            loss=1.5,
            samples=10,
            metrics=json.dumps({"loss": 1.5, "accuracy": 0.5}),
        ),
        Evaluation(id=3, run="r", version=2, epoch=0, split="train", loss=1.0, samples=10),
    ]
    return run, subtasks, attempts, versions, evals


def test_figures_count_what_the_ledger_holds() -> None:
    run, subtasks, attempts, versions, evals = _rows()
    f = ledger_figures(
        run,
        3,
        subtasks,
        attempts,
        versions,
        evals,
        load_prices(),
        now=T0 + timedelta(seconds=20),
        instance_type="g4dn.xlarge",
    )
    assert f.attempts_started == 6
    assert f.attempts_by_state == {"killed": 1, "merged": 2, "rejected": 2, "running": 1}
    assert f.outcomes == {"duplicate": 0, "failed": 0, "merged": 2, "rejected": 2}
    assert f.merges == 2 and f.head_version == 2 and f.reissues == 3
    assert f.rejections == {"bad_report": 1, "stale": 1}
    assert f.staleness.counts[0] == 1 and f.staleness.count == 2 and f.staleness.total == 3
    # Phases of ended attempts only (not the running one's 99 s), the merge's apart,
    # and the checkpoint failure count is no phase.
    assert f.attempt_phases["read"].count == 3 and f.attempt_phases["read"].total < 1
    assert "checkpoint_failures" not in f.attempt_phases
    assert f.merge_phases["merge"].count == 2 and f.merge_phases["read_result"].count == 1
    assert f.merge_seconds.count == 2 and f.merge_seconds.total == pytest.approx(0.62)
    assert f.evaluation == {"loss": 1.5, "accuracy": 0.5} and f.evaluation_version == 2
    # vcdl status' goodput: the merged attempts' seconds over all attempts' seconds
    # (killed: its wall time; running: none yet).
    assert f.goodput == pytest.approx(16.0 / (8.0 + 10.0 + 8.0 + 8.0 + 0.0 + 8.0))
    assert f.spend_usd is not None and f.spend_usd > 0
    assert f.waste_usd is not None and 0 < f.waste_usd < f.spend_usd


def test_rendering_names_the_run_and_matches_the_figures() -> None:
    run, subtasks, attempts, versions, evals = _rows()
    f = ledger_figures(run, 3, subtasks, attempts, versions, evals, None, now=T0)
    registry = CollectorRegistry()

    class Fixed(RunCollector):
        def figures(self):  # type: ignore[no-untyped-def]
            return f

    collector = Fixed("r")
    collector.note_event(TaskReturned((0, 1), "handed_back", ()))
    collector.note_event(TaskReturned((0, 1), "interrupted", (), attempt_id="a2"))
    collector.note_event(TaskReturned((0, 1), "finished", (), attempt_id="a2"))
    collector.note_kill("killed")
    registry.register(collector)
    samples = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("run",)))): s.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
        if s.labels.get("run") == "r"
    }
    assert samples[("vcdl_attempts_total", (("outcome", "merged"),))] == 2
    assert samples[("vcdl_attempts_total", (("outcome", "rejected"),))] == 2
    assert samples[("vcdl_attempts_in_state", (("state", "killed"),))] == 1
    assert samples[("vcdl_merges_total", ())] == 2
    assert samples[("vcdl_head_version", ())] == 2
    assert samples[("vcdl_rejections_total", (("reason", "stale"),))] == 1
    assert samples[("vcdl_preemption_notices_total", (("response", "handed_back"),))] == 1
    assert samples[("vcdl_preemption_notices_total", (("response", "interrupted"),))] == 1
    assert samples[("vcdl_kills_total", (("how", "killed"),))] == 1
    assert samples[("vcdl_eval_metric", (("metric", "accuracy"),))] == 0.5
    assert samples[("vcdl_staleness_count", ())] == 2
    assert samples[("vcdl_staleness_bucket", (("le", "2.0"),))] == 1
    assert samples[("vcdl_attempt_phase_seconds_count", (("phase", "train"),))] == 2
    assert samples[("vcdl_run_state", (("state", "running"),))] == 1
    assert ("vcdl_spend_usd", ()) not in samples  # no prices given: no figure, not 0


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("stale: staleness 9 > 4", "stale"),
        (
            "partial result (10/100 samples) discarded by policy fault.partial=discard",
            "partial_discarded",
        ),
        ("bad report from the worker: sample count 0 is not positive", "bad_report"),
        ("result unreadable: no group at results/x", "unreadable"),
        ("result contains 3 NaN and 0 Inf values (of 10)", "non_finite"),
        ("update norm 12 exceeds max_update_norm 5", "update_norm"),
        ("key sets differ (missing: [w]); result is not a state of this model", "shape"),
        ("result has an unknown encoding 'zip'", "encoding"),
        (None, "other"),
        ("something new", "other"),
    ],
)
def test_rejection_classes(reason: str | None, kind: str) -> None:
    assert rejection_class(reason) == kind and kind in REJECTION_CLASSES


@settings(deadline=None)  # a loaded CI machine: no per-example time limit
@given(st.lists(st.floats(0, 1e4)), st.lists(st.floats(0, 1e3), min_size=1, unique=True))
def test_histogram_buckets_are_cumulative_counts(values: list[float], bounds: list[float]) -> None:
    bounds = sorted(bounds)
    h = Histogram.of(values, bounds)
    assert list(h.counts) == [sum(v <= b for v in values) for b in bounds] + [len(values)]
    assert h.buckets()[-1] == ("+Inf", float(len(values)))


def _paths(state: str, depth: int) -> st.SearchStrategy[list[str]]:
    """Random legal walks of an attempt through its lifecycle."""
    if depth == 0 or not ATTEMPT_MOVES[state]:
        return st.just([state])
    return st.sampled_from(sorted(ATTEMPT_MOVES[state])).flatmap(
        lambda nxt: _paths(nxt, depth - 1).map(lambda rest: [state, *rest])
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(_paths("running", 4), min_size=1, max_size=6), st.randoms())
def test_counters_never_fall_whatever_legal_moves_the_attempts_make(
    walks: list[list[str]], rnd: object
) -> None:
    """The outcomes rendered as counters only grow as attempts move through the ledger."""
    run = Run(name="r", config="{}")
    steps = [(i, s) for i, walk in enumerate(walks) for s in walk[1:]]
    rnd.shuffle(steps)  # type: ignore[attr-defined]
    steps.sort(key=lambda x: walks[x[0]].index(x[1]))  # keep each walk's order
    state = {i: "running" for i in range(len(walks))}
    before = None
    for i, s in steps:
        state[i] = s
        f = ledger_figures(
            run, 1, [], [_attempt(j, st_) for j, st_ in state.items()], [], [], now=T0
        )
        if before is not None:
            assert all(f.outcomes[k] >= before.outcomes[k] for k in FINAL_OUTCOMES)
        before = f


def test_endpoint_serves_its_own_registry_and_a_taken_port_is_one_line() -> None:
    section = MetricsSection(port=free_port())
    with serve_metrics(section, "r1") as collector:
        assert collector is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{section.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'vcdl_kills_total{how="killed",run="r1"} 0.0' in text
        assert "python_gc" not in text and "process_" not in text  # not the global registry
        with pytest.raises(ConfigError) as info:
            check_endpoint(section)
        assert str(section.port) in str(info.value) and "\n" not in str(info.value)
        with pytest.raises(ConfigError), serve_metrics(section, "r2"):
            pass
    check_endpoint(section)  # free again once the run ends
    check_endpoint(MetricsSection())  # no port: nothing to check
    with serve_metrics(MetricsSection(), "r3") as none:
        assert none is None


def test_every_family_is_described_without_a_ledger() -> None:
    names = {m.name for m in RunCollector("r").describe()}
    assert names >= {m.name for m in families("r", None, {}, {})}
    assert all(n.startswith("vcdl_") for n in names)


class _Reads:
    """Stands in for the ledger read: counts calls, can fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def __call__(self, ref: object, cfg: object, prices: object) -> object:
        self.calls += 1
        if self.fail:
            raise OSError("ledger gone")
        return ("figures", self.calls)


def test_reads_are_shared_kept_on_failure_and_repeated_after_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = _Reads()
    monkeypatch.setattr("vcdl.metrics.exporter.read_figures", reads)
    c = RunCollector("r", min_refresh=60)
    assert c.figures() is None and reads.calls == 0  # not following a run yet
    c.follow(object(), parse_config({}))  # type: ignore[arg-type]
    assert c.figures() == ("figures", 1) and c.figures() == ("figures", 1)
    assert reads.calls == 1  # scrapes close together share a read
    c.end()
    assert not c.final_read.is_set()
    reads.fail = True
    assert c.figures() == ("figures", 1)  # a failed read keeps the last figures
    assert c._read_errors == 1 and c.final_read.is_set()


def test_linger_waits_for_one_scrape_after_the_run_and_no_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("vcdl.metrics.exporter.read_figures", lambda *a: None)
    section = MetricsSection(port=free_port(), linger=20)
    url = f"http://127.0.0.1:{section.port}/metrics"

    def scrape_later() -> None:
        time.sleep(0.5)
        urllib.request.urlopen(url, timeout=10).read()

    with serve_metrics(section, "r") as collector:
        assert collector is not None
        collector.follow(object(), parse_config({}))  # type: ignore[arg-type]
        t = threading.Thread(target=scrape_later)
        t.start()
        started = time.monotonic()
    waited = time.monotonic() - started
    t.join()
    assert 0.4 < waited < 10, waited  # until the scrape, not the 20 s
    # No run followed (it was never created): nothing final to wait for.
    started = time.monotonic()
    with serve_metrics(section.model_copy(update={"linger": 5}), "r"):
        pass
    assert time.monotonic() - started < 2
    # Interrupted (Ctrl-C): no waiting either.
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), serve_metrics(section, "r") as collector:
        assert collector is not None
        collector.follow(object(), parse_config({}))  # type: ignore[arg-type]
        raise KeyboardInterrupt
    assert time.monotonic() - started < 2


def test_a_slow_read_spaces_the_next_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _Reads()

    def slow(*args: object) -> object:
        time.sleep(0.05)
        return reads(*args)

    monkeypatch.setattr("vcdl.metrics.exporter.read_figures", slow)
    c = RunCollector("r", min_refresh=0.0)
    c.follow(object(), parse_config({}))  # type: ignore[arg-type]
    c.figures()
    c.figures()  # within ten times the first read's 0.05 s
    assert reads.calls == 1
    time.sleep(0.6)
    c.figures()
    assert reads.calls == 2

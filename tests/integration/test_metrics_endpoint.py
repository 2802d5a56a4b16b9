"""A real run serves its metrics over HTTP while it trains; the counts are the ledger's."""

from __future__ import annotations

import itertools
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port
from vcdl import api
from vcdl.config import parse_config
from vcdl.ledger import Ledger
from vcdl.metrics.figures import FINAL_OUTCOMES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.alone]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _parse(text: str, run: str) -> Samples:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "run"))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.labels.get("run") == run
    }


class Scraper(threading.Thread):
    """Scrapes the endpoint every ``every`` seconds until told to stop."""

    def __init__(self, url: str, run: str, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.url, self.run_name, self.every = url, run, every
        self.scrapes: list[Samples] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    self.scrapes.append(_parse(r.read().decode(), self.run_name))
            except (urllib.error.URLError, ConnectionError):
                pass  # not up yet, or gone
            self.stop.wait(self.every)


def _value(s: Samples, name: str, **labels: str) -> float:
    return s.get((name, tuple(sorted(labels.items()))), 0.0)


# A run long enough that scrapes 0.25 s apart see it between its first and
# last merge: 2 epochs of 2000 samples merged all 8 results within 0.7 s in
# CI once, and no scrape fell in between.
EPOCHS, SHARDS = 4, 4
MERGES = EPOCHS * SHARDS


def test_metrics_during_a_run_match_the_ledger(prefect_api: None, tmp_path: Path) -> None:
    port = free_port()
    cfg = parse_config(
        {
            "run": {"name": "metrics-run", "epochs": EPOCHS, "seed": 1},
            "data": {"name": "mnist1d", "samples": 4000, "shards": SHARDS},
            "model": {"factory": "cnn1d", "kwargs": {"width": 16}},
            "train": {"lr": 1e-2, "batch_size": 100},
            "cluster": {"workers": 2},
            # linger: the driver waits for one scrape that reads the finished run.
            "metrics": {"port": port, "linger": 30},
        }
    )
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", "metrics-run")
    scraper.start()
    started = time.monotonic()
    summary = api.train(cfg, home=tmp_path)
    took = time.monotonic() - started
    scraper.stop.set()
    scraper.join(timeout=10)
    assert summary["state"] == "completed"

    scrapes = [s for s in scraper.scrapes if s]  # before the run exists: no run samples
    assert len(scrapes) >= 5, len(scrapes)
    running = [s for s in scrapes if _value(s, "vcdl_run_state", state="running") == 1]
    assert running, "no scrape saw the run running"
    during = [s for s in running if 0 < _value(s, "vcdl_merges_total") < MERGES]
    assert during, "no scrape saw the run between its first and last merge"
    # Counters never fall from one scrape to the next.
    for a, b in itertools.pairwise(scrapes):
        for key, value in a.items():
            if key[0].endswith(("_total", "_count", "_bucket")):
                assert b.get(key, 0.0) >= value, (key, value, b.get(key))

    final = scrapes[-1]
    assert _value(final, "vcdl_run_state", state="completed") == 1
    with Ledger(cfg.with_locations(tmp_path).ledger.url or "") as ledger:
        run = ledger.get_run("metrics-run")
        attempts = ledger.attempts("metrics-run")
        versions = ledger.versions("metrics-run")
        subtasks = ledger.subtasks("metrics-run")
        tests = [e for e in ledger.evaluations("metrics-run") if e.split == "test"]
    states = Counter(a.state for a in attempts)
    assert _value(final, "vcdl_head_version") == run.head_version == MERGES
    assert _value(final, "vcdl_merges_total") == sum(1 for v in versions if v.subtask_id) == MERGES
    assert _value(final, "vcdl_attempts_started_total") == len(attempts)
    for outcome in FINAL_OUTCOMES:
        assert _value(final, "vcdl_attempts_total", outcome=outcome) == states.get(outcome, 0)
    for state, n in states.items():
        assert _value(final, "vcdl_attempts_in_state", state=state) == n
    assert _value(final, "vcdl_reissues_total") == sum(max(0, s.attempts - 1) for s in subtasks)
    assert _value(final, "vcdl_epochs_completed") == EPOCHS
    assert _value(final, "vcdl_staleness_count") == MERGES
    assert _value(final, "vcdl_merge_seconds_count") == states["merged"]
    assert _value(final, "vcdl_attempt_phase_seconds_count", phase="train") == len(
        [a for a in attempts if a.state in FINAL_OUTCOMES and a.timings]
    )
    assert _value(final, "vcdl_eval_version") == tests[-1].version == MERGES
    assert _value(final, "vcdl_eval_metric", metric="loss") == pytest.approx(tests[-1].loss)
    assert 0 < _value(final, "vcdl_goodput") <= 1
    assert _value(final, "vcdl_spend_usd") > 0
    print(f"run with metrics: {took:.1f} s, {len(scrapes)} scrapes, {len(during)} mid-run")
    # The endpoint is gone with the run.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)

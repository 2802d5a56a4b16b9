"""Sanity of benchmarks/time_to_accuracy.py's ``--quick`` path (no timing thresholds).

Runs both parts at the quick sizes (part a with a delta-rule variant of
vcdl beside the shipped config, and DDP with and without vcdl's allocator
thresholds): every contender must have trained and
been evaluated (accuracies in [0, 1], timestamps after time zero), the kill
schedule must have hit both contenders of part (b), and torchrun must have
resumed DDP from a checkpoint at least once.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.time_to_accuracy import QUICK, run_benchmark, summary_line
from tests.logrecords import RecordingHandler
from vcdl.worker.allocator import TUNED_ENV

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(1200), pytest.mark.alone]


def _check_curve(curve: list[tuple[float, float]]) -> None:
    assert curve, "no durable state was evaluated"
    assert all(0.0 <= acc <= 1.0 for _, acc in curve)
    assert all(t >= 0.0 for t, _ in curve)
    assert [t for t, _ in curve] == sorted(t for t, _ in curve)


def test_quick_benchmark_is_sane(prefect_api: None, tmp_path: Path) -> None:
    # distributed's loggers do not propagate to the root (caplog would not
    # see them): a handler on the client's own logger does.
    client_errors = RecordingHandler(logging.ERROR)
    logging.getLogger("distributed.client").addHandler(client_errors)
    try:
        _check_quick_benchmark(tmp_path)
    finally:
        logging.getLogger("distributed.client").removeHandler(client_errors)
    # The kill schedule's Dask client closes before vcdl's cluster does: one
    # left open reconnects to the closed scheduler and logs tracebacks.
    assert [
        f"{r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
        for r in client_errors.records
    ] == []


def _check_quick_benchmark(tmp_path: Path) -> None:
    # One variant beside the shipped config: the delta rule, through the
    # whole flow (Prefect, Dask, the driver's cache of recent bases).
    s = replace(
        QUICK, cache_dir=str(tmp_path / "cache"), variants=("merge.rule=delta,merge.alpha=0.5",)
    )
    res = run_benchmark(s, tmp_path / "work")
    print(json.dumps(summary_line(res)))

    a = res["a"]
    names = ("vcdl", "vcdl merge.rule=delta,merge.alpha=0.5", "one_process", "ddp", "ddp_tuned")
    for name in names:
        assert len(a[name]["runs"]) == s.repeats_a
        for run in a[name]["runs"]:
            _check_curve(run["curve"])
    # The tuned contender's ranks started with vcdl's thresholds, the other with none.
    inherited = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    assert a["ddp_tuned"]["runs"][0]["malloc_env"] == inherited | TUNED_ENV
    assert a["ddp"]["runs"][0]["malloc_env"] == inherited
    assert a["vcdl"]["runs"][0]["t0"] == "driver's first submission"

    b = res["b"]
    vc, ddp = b["vcdl"]["runs"][0], b["ddp"]["runs"][0]
    _check_curve(vc["curve"])
    _check_curve(ddp["curve"])
    assert vc["kills"] >= 1, vc
    assert ddp["kills"] >= 1, ddp
    assert ddp["resumed_from_checkpoint"] >= 1, ddp
    assert 0.0 < vc["utilization"] <= 1.0
    assert {v["result"] for v in res["verdicts"]} <= {"PASS", "MISS", None}
    assert len(res["verdicts"]) == 5

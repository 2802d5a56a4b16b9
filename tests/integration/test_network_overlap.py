"""Issue 50 item 6: the worker's network waits overlapped, recorded, and results unchanged.

In process (fast): attempts of one epoch with a pinned base on one worker
runtime read the base once and keep it, record ``net_wait``, and write
results bit for bit equal to those of attempts that read it themselves
(``VCDL_NETWORK_OVERLAP=0``). A real run (slow): the train flow on a
LocalCluster, its store on S3 (moto) behind the fleet harness's userspace
proxy with 20 ms of round trip, the averaging rule, one shard an epoch; with
and without the overlaps, the final versions are equal bit for bit, ``net_wait`` is in the
ledger and in ``vcdl status``'s phases, and the audit is clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch

from benchmarks.netfleet import LinkProfile
from benchmarks.netfleet.proxy import DRIVER, LinkProxy
from tests.integration.test_failure_modes import make_run
from tests.s3fixture import make_bucket
from vcdl import api
from vcdl.config import parse_config
from vcdl.ledger import attempt_timings
from vcdl.runtime import RunRef
from vcdl.types import StateDict
from vcdl.views.audit import audit_run
from vcdl.worker.attempt import run_attempt
from vcdl.worker.basecache import OVERLAP_ENV
from vcdl.worker.baseread import NET_WAIT_KEY
from vcdl.worker.runtime import WorkerRuntime


def _result(ref: RunRef, attempt_id: str | None) -> StateDict:
    assert attempt_id is not None
    uri = ref.ledger().get_attempt(attempt_id).result_uri
    assert uri is not None
    return ref.store().read_state(uri)


def _same(a: StateDict, b: StateDict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _epoch(tmp: Path, overlap: bool, monkeypatch: pytest.MonkeyPatch) -> list[StateDict]:
    monkeypatch.setenv(OVERLAP_ENV, "1" if overlap else "0")
    ref, cfg = make_run(tmp, rule="average")
    runtime = WorkerRuntime()
    handed_on: list[int] = []
    results = []
    for shard in range(4):
        out = run_attempt(
            ref,
            0,
            shard,
            base_version=0,
            config=cfg,
            runtime=runtime,
            trained=lambda s=shard: handed_on.append(s),
        )
        row = attempt_timings(ref.ledger().get_attempt(str(out.attempt_id)))
        assert 0 <= row[NET_WAIT_KEY] <= row["read"] + row["write"]
        if not overlap:  # every read and write is waited for
            assert row[NET_WAIT_KEY] >= row["write"] * 0.5 > 0
        # Read in the background by the first attempt only; kept for the others.
        assert ("base_read" in row) == (overlap and shard == 0), (shard, row)
        results.append(_result(ref, out.attempt_id))
    assert handed_on == ([0, 1, 2, 3] if overlap else [])
    assert (runtime.bases.kept() is not None) == overlap
    return results


def test_a_kept_base_trains_the_same_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_overlap = _epoch(tmp_path / "on", True, monkeypatch)
    without = _epoch(tmp_path / "off", False, monkeypatch)
    for a, b in zip(with_overlap, without, strict=True):
        _same(a, b)


def test_a_head_read_at_claim_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OVERLAP_ENV, "1")
    ref, cfg = make_run(tmp_path)  # VC-ASGD: the head at claim time
    runtime = WorkerRuntime()
    out = run_attempt(ref, 0, 0, config=cfg, runtime=runtime)
    assert runtime.bases.kept() is None
    assert NET_WAIT_KEY in out.timings and "base_read" in out.timings


@pytest.fixture
def slow_s3(s3_endpoint: str) -> Iterator[str]:
    """The moto S3 behind the harness's proxy, 20 ms of round trip: its endpoint URL."""
    proxy = LinkProxy(lambda _peer: DRIVER)
    try:
        proxy.set_profile(DRIVER, LinkProfile(latency_ms=20))
        target = urlsplit(s3_endpoint)
        host, port = proxy.add_route("s3", "127.0.0.1", (target.hostname or "", target.port or 0))
        yield f"http://{host}:{port}"
    finally:
        proxy.close()


def _real_run(
    home: Path, endpoint: str, bucket: str, overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[RunRef, dict[str, object]]:
    # The LocalCluster's worker processes inherit it.
    monkeypatch.setenv(OVERLAP_ENV, "1" if overlap else "0")
    cfg = parse_config(
        {
            # One shard an epoch: results merge in one order in both runs (with
            # several, which of the worker's two Dask threads gets the training
            # slot first is a race, overlap or not, and a mean's bits depend on
            # its order). A kept base's reuse within an epoch is the fast test's.
            "run": {"name": "overlap", "epochs": 2, "seed": 5},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 1},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "merge": {"rule": "average"},
            "cluster": {"workers": 1},
            "ledger": {"url": f"sqlite:///{home / 'ledger.db'}"},
            "store": {
                "url": f"s3://{bucket}/{'on' if overlap else 'off'}",
                "storage_options": {"endpoint_url": endpoint},
            },
        }
    )
    summary = api.train(cfg, home=home)
    assert summary["state"] == "completed", summary
    ref = api.run_ref("overlap", home=home, ledger_url=cfg.ledger.url)
    assert audit_run(ref, deep=True) == []
    return ref, api.status("overlap", home=home, ledger_url=cfg.ledger.url)


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.timeout(600)
def test_a_real_run_over_a_slow_link_records_the_wait_and_merges_the_same(
    prefect_api: None,
    s3_endpoint: str,
    slow_s3: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = make_bucket(s3_endpoint)
    on, status_on = _real_run(tmp_path / "on", slow_s3, bucket, True, monkeypatch)
    off, status_off = _real_run(tmp_path / "off", slow_s3, bucket, False, monkeypatch)
    for ref, status in ((on, status_on), (off, status_off)):
        phases = status["phases"]
        assert isinstance(phases, dict) and phases.get(NET_WAIT_KEY, 0) > 0, phases
        merged = [a for a in ref.ledger().attempts(ref.run) if a.state == "merged"]
        assert merged and all(NET_WAIT_KEY in attempt_timings(a) for a in merged)
    head_on, head_off = on.ledger().head(on.run), off.ledger().head(off.run)
    assert head_on.number == head_off.number
    _same(on.store().read_state(head_on.uri), off.store().read_state(head_off.uri))
    # With the overlaps, each attempt's pinned base was read in the background; without, never.
    assert all("base_read" in attempt_timings(a) for a in on.ledger().attempts(on.run))
    assert not any("base_read" in attempt_timings(a) for a in off.ledger().attempts(off.run))

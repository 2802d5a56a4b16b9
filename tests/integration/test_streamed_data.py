"""Data larger than a worker's cache: attempts stream it, record what they read, and never
hold the split (a worker under a memory limit smaller than the split trains)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import scale_data
from vcdl.cli import main
from vcdl.config import RunConfig, parse_config
from vcdl.data import shard_indices, stream_rows, write_dataset
from vcdl.data.stream import group_by_chunk
from vcdl.driver.runs import prepare_run
from vcdl.runtime import RunRef
from vcdl.store import WeightStore
from vcdl.worker.attempt import run_attempt


def _run(home: Path, cache_mb: int, plan: str = "blocks") -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": "sd", "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 4, "cache_mb": cache_mb},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
        }
    ).with_locations(home)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"plan": plan})})
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 4)
    return ref, cfg


def _cli(argv: list[str]) -> None:
    try:
        main(argv)
    except SystemExit as exc:
        assert not exc.code


def test_data_bytes_are_recorded_and_shown_in_status_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, cfg = _run(tmp_path, cache_mb=0)
    outs = [run_attempt(ref, 0, s, base_version=0, config=cfg) for s in range(4)]
    attempts = {a.id: a for a in ref.ledger().attempts(ref.run, 0)}
    for out in outs:
        row = attempts[str(out.attempt_id)]
        assert row.data_bytes == out.data_bytes > 0
        assert row.data_requests is not None and row.data_requests > 0
        # The result's tensors (no checkpoints in this run).
        assert row.written_bytes == out.written_bytes > 0
    capsys.readouterr()
    _cli(["status", ref.run, "--home", str(tmp_path), "--json"])
    status = json.loads(capsys.readouterr().out)
    total = sum(a.data_bytes or 0 for a in attempts.values())
    assert status["data_bytes"] == total
    assert status["history"][0]["data_bytes"] == total
    assert status["written_bytes"] == sum(a.written_bytes or 0 for a in attempts.values())
    assert status["data_requests"] == sum(a.data_requests or 0 for a in attempts.values())
    _cli(["status", ref.run, "--home", str(tmp_path)])
    assert "read MB" in capsys.readouterr().out


def test_a_cached_split_is_fetched_once_per_process(tmp_path: Path) -> None:
    ref, cfg = _run(tmp_path, cache_mb=256)
    first = run_attempt(ref, 0, 0, base_version=0, config=cfg)
    second = run_attempt(ref, 0, 1, base_version=0, config=cfg)
    # The second reads only the arrays' metadata: the rows come from the cache.
    assert second.data_bytes < first.data_bytes / 10


@pytest.mark.slow
def test_a_worker_limited_below_the_split_trains_by_streaming(tmp_path: Path) -> None:
    """Split 128 MiB, a shard 64 MiB, the worker's address space capped 48 MiB above its size
    after a warm-up attempt: streaming trains; the same attempt holding the split fails."""
    big = scale_data.make_dataset(tmp_path, "big", 128 << 20, features=248)
    small = scale_data.make_dataset(tmp_path, "small", 1 << 20, features=248)
    assert big["decoded_bytes"] >= 128 << 20
    scale_data.prepare(tmp_path, "warm", small["name"], 2, "blocks", 1)
    scale_data.prepare(tmp_path, "big", big["name"], 2, "blocks", 1)
    out = scale_data.run_worker(
        tmp_path, "big", big["name"], 2, 1, [0], limit_mb=48, warmup=("warm", small["name"])
    )
    assert out["limit"] is not None
    (attempt,) = out["attempts"]
    assert attempt["state"] == "finished" and attempt["loss"] == attempt["loss"]  # not NaN
    assert attempt["data"] >= big["stored_bytes"] / 2 * 0.9
    # The control: the same worker and limit, the split cached whole, cannot train.
    scale_data.prepare(tmp_path, "warm-cached", small["name"], 2, "blocks", 1024)
    scale_data.prepare(tmp_path, "big-cached", big["name"], 2, "blocks", 1024)
    with pytest.raises(RuntimeError, match="MemoryError"):
        scale_data.run_worker(
            tmp_path,
            "big-cached",
            big["name"],
            2,
            1024,
            [0],
            limit_mb=48,
            warmup=("warm-cached", small["name"]),
        )


def test_a_shard_streams_from_s3_and_counts_what_it_fetched(
    s3_bucket_url: tuple[str, dict[str, Any]],
) -> None:
    url, options = s3_bucket_url
    store = WeightStore(url, storage_options=options)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (3000, 2000), dtype=np.uint8)  # 3 chunks of about 2 MiB
    y = rng.integers(0, 10, 3000)
    info = write_dataset(store, "s3set", x, y, x[:10], y[:10], source="test")
    rows = shard_indices(3000, 2, 0, 0, 1, block=info.splits["train"].rows_per_chunk)
    stream = stream_rows(store, "s3set", "train", rows)
    got = list(stream.blocks())
    expected = group_by_chunk(rows, info.splits["train"].rows_per_chunk)
    assert len(got) == len(expected) >= 2
    for block, want in zip(got, expected, strict=True):
        assert np.array_equal(block["x"], x[want]) and np.array_equal(block["y"], y[want])
    # Compressed chunks as S3 returned them, one GET per chunk and array at least.
    assert stream.bytes_read > 0 and stream.counter.requests >= 2 * len(got)

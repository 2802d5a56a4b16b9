"""``vcdl replay`` (issue 53, item 2) on real ledgers and stores.

The fast tests drive a run in this process with the worker's and the
assimilator's own code (``run_attempt``, ``merge_attempt``): every merge rule,
each result precision, a partial result, an optimizer state and an EASGD
variable carried between attempts, a worker SIGKILLed mid-attempt whose
checkpoint the next attempt resumes; each replays bit for bit. A version
rewritten in the store is named with its tensor; a run recorded before ledger
migration 0011 says it cannot be replayed and why. The slow test replays a
real run of the train flow on a LocalCluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from vcdl import api
from vcdl.cli import main
from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.head_cache import head_cache
from vcdl.driver.runs import prepare_run
from vcdl.merge.rules import RULES, rule_of
from vcdl.replay.plan import NotReplayable, replay_inputs
from vcdl.replay.runner import replay_run
from vcdl.runtime import RunRef
from vcdl.worker.attempt import run_attempt
from vcdl.worker.runtime import WorkerRuntime

pytestmark = pytest.mark.timeout(300)


def config(
    tmp: Path, name: str = "rp", rule: str = "vc_asgd", epochs: int = 2, **sections: Any
) -> RunConfig:
    doc: dict[str, Any] = {
        "run": {"name": name, "epochs": epochs, "seed": 3},
        "data": {"name": "mnist1d", "samples": 1000, "shards": 3},
        "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
        "train": {"batch_size": 50, "lr": 1e-2},
        "merge": {"rule": rule, "alpha": 0.5},
    }
    for key, values in sections.items():
        doc[key] = {**doc.get(key, {}), **values}
    return parse_config(doc).with_locations(tmp)


def drive(
    cfg: RunConfig,
    *,
    runtime: WorkerRuntime | None = None,
    stop: dict[tuple[int, int], int] | None = None,
) -> RunRef:
    """Train and merge every subtask, epoch by epoch, in this process.

    ``stop``: (epoch, shard) -> the batches after which that attempt gets a
    preemption notice (a partial result). ``runtime``: one worker process's
    state for every attempt (what it carries between them).
    """
    ref, _, _ = prepare_run(cfg)
    ledger, cache = ref.ledger(), head_cache(cfg)
    for epoch in range(cfg.run.epochs):
        ledger.ensure_subtasks(ref.run, epoch, cfg.data.shards)
        pinned = ledger.head(ref.run).number if rule_of(cfg).pins_base else None
        for shard in range(cfg.data.shards):
            calls = (
                iter(range(stop[(epoch, shard)] + 1)) if stop and (epoch, shard) in stop else None
            )
            outcome = run_attempt(
                ref,
                epoch,
                shard,
                base_version=pinned,
                config=cfg,
                runtime=runtime,
                should_stop=(lambda c=calls: next(c, None) is None) if calls else None,
            )
            assert outcome.attempt_id is not None
            assert merge_attempt(ref, outcome.attempt_id, cfg, cache).kind == "merged"
    return ref


def assert_bit_for_bit(ref: RunRef) -> None:
    report = replay_run(ref)
    assert report.divergence is None, report.divergence
    assert (
        report.bit_for_bit and report.versions == report.last == ref.ledger().head(ref.run).number
    )
    assert report.compared == report.versions


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_replays_bit_for_bit(tmp_path: Path, rule: str) -> None:
    assert_bit_for_bit(drive(config(tmp_path, rule=rule)))


@pytest.mark.parametrize("precision", ["bf16_delta", "int8_delta"])
def test_reduced_precision_results_replay_bit_for_bit(tmp_path: Path, precision: str) -> None:
    ref = drive(config(tmp_path, rule="delta", merge={"result_precision": precision}))
    assert_bit_for_bit(ref)


def test_a_partial_result_replays_bit_for_bit(tmp_path: Path) -> None:
    # Notices after 3 and 4 batches of 50 (a shard is 266 or 267 rows).
    ref = drive(config(tmp_path), stop={(0, 1): 2, (1, 2): 3})
    samples = sorted(a.samples or 0 for a in ref.ledger().attempts(ref.run))
    assert samples[:2] == [150, 200] and samples[2] >= 266
    assert_bit_for_bit(ref)


def test_carried_optimizer_state_replays_bit_for_bit(tmp_path: Path) -> None:
    cfg = config(tmp_path, train={"optimizer": "adam", "optimizer_state": "worker", "lr": 1e-3})
    ref = drive(cfg, runtime=WorkerRuntime())
    carried = [replay_inputs(a) for a in ref.ledger().attempts(ref.run)]
    assert sum(1 for c in carried if c and c["optimizer_from"]) == 5  # all but the first
    assert_bit_for_bit(ref)


def test_an_easgd_variable_replays_bit_for_bit(tmp_path: Path) -> None:
    ref = drive(config(tmp_path, rule="easgd"), runtime=WorkerRuntime())
    carried = [replay_inputs(a) for a in ref.ledger().attempts(ref.run)]
    assert sum(1 for c in carried if c and c["variable_from"]) == 5
    assert_bit_for_bit(ref)


_CHILD = """
import sys
from vcdl.config import RunConfig
from vcdl.runtime import RunRef
from vcdl.worker.attempt import run_attempt
ref = RunRef.model_validate_json(sys.argv[1])
run_attempt(ref, 0, 1, config=RunConfig.model_validate_json(sys.argv[2]))
"""


@pytest.mark.slow
def test_a_killed_worker_resumed_from_its_checkpoint_replays_bit_for_bit(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        epochs=1,
        model={
            "factory": "tests.integration.replay_models:killed_at",
            "kwargs": {"marker": str(tmp_path / "killed"), "kill_at": 4},
        },
        train={"optimizer": "sgd", "momentum": 0.9},
        fault={"checkpoint_seconds": 0.0001, "checkpoint_write_ratio": 1},
    )
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 3)
    # Epoch 0's shard 1 on a worker that is SIGKILLed in its 4th batch: its
    # checkpoint stays, the attempt's row says running.
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, ref.model_dump_json(), cfg.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    (killed,) = ref.ledger().attempts(ref.run)
    assert killed.state == "running" and killed.checkpoint_uri and killed.samples
    ref2 = drive(cfg)  # the same run: shard 1's attempt resumes the checkpoint
    (resumer,) = [a for a in ref2.ledger().attempts(ref.run) if a.resumed_from == killed.id]
    assert resumer.state == "merged"
    inputs = replay_inputs(resumer)
    assert inputs is not None and 0 < inputs["start_samples"] < 300
    assert_bit_for_bit(ref)


def test_a_tampered_version_is_named_with_its_tensor(tmp_path: Path) -> None:
    ref = drive(config(tmp_path))
    row = ref.ledger().get_version(ref.run, 3)
    group = Path(ref.store().url.removeprefix("file://")) / row.uri
    chunk = sorted(p for p in group.rglob("*") if p.is_file() and "zarr.json" not in p.name)[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x40  # one float's bits, in a chunk of the stored version
    chunk.write_bytes(bytes(data))
    report = replay_run(ref)
    d = report.divergence
    assert d is not None and not report.bit_for_bit
    assert (d.version, d.attempt, d.kind) == (3, row.attempt_id, "stored")
    assert d.tensor in ref.store().read_state(ref.ledger().get_version(ref.run, 2).uri)
    # Versions 1 and 2 were compared and matched; nothing after 3 was made.
    assert report.versions == 3


def test_keep_going_reports_each_versions_deviation_from_the_record(tmp_path: Path) -> None:
    """As for a run trained on a GPU: a version that differs is reported with its largest
    deviation and the replay goes on from the recorded version, so the next agree again."""
    cfg = config(tmp_path)
    ref = drive(cfg)
    wrong = ref.ledger().get_version(ref.run, 2).attempt_id
    inputs = replay_inputs(ref.ledger().get_attempt(wrong or ""))
    assert inputs is not None
    inputs.update(seed=inputs["seed"] + 1, device="cuda")  # another batch order; "a GPU"
    ref.ledger().record_replay_inputs(wrong or "", inputs)
    report = replay_run(ref)  # keep_going: a GPU attempt
    d = report.divergence
    assert d is not None and (d.version, d.kind) == (2, "checksum") and d.tensor is not None
    assert d.max_abs_deviation is not None and d.max_abs_deviation > 0
    assert report.versions == 6 and [v.version for v in report.deviations] == [1, 2, 3, 4, 5, 6]
    assert [v.max_abs_deviation > 0 for v in report.deviations] == [0, 1, 0, 0, 0, 0]
    assert report.deviations[1].max_abs_deviation >= d.max_abs_deviation
    assert any("cuda" in n for n in report.notes)
    stopped = replay_run(ref, keep_going=False)
    assert stopped.versions == 2 and stopped.deviations == []


def test_the_cli_replays_a_range_as_json_and_refuses_a_run_recorded_before_0011(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config(tmp_path)
    ref = drive(cfg)
    assert cfg.ledger.url is not None
    with pytest.raises(SystemExit) as ended:
        main(["replay", ref.run, "--ledger", cfg.ledger.url, "--from", "2", "--to", "5", "--json"])
    out, err = capsys.readouterr()
    assert ended.value.code in (0, None), err
    doc = json.loads(out)
    assert doc["bit_for_bit"] and (doc["first"], doc["last"], doc["versions"]) == (2, 5, 3)
    assert "version 5 (3/3)" in err  # progress on stderr

    # An attempt recorded before the migration: no replay inputs.
    merged = ref.ledger().get_version(ref.run, 4).attempt_id
    engine = create_engine(cfg.ledger.url)
    with engine.begin() as c:
        c.execute(text("UPDATE attempt SET replay_inputs = NULL WHERE id = :i"), {"i": merged})
    engine.dispose()
    with pytest.raises(NotReplayable, match="before ledger migration 0011"):
        replay_run(ref)
    replay_run(ref, last=3)  # the versions before it still replay
    with pytest.raises(SystemExit) as ended:
        main(["replay", ref.run, "--ledger", cfg.ledger.url])
    out, err = capsys.readouterr()
    assert ended.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "migration 0011" in err


@pytest.mark.slow
def test_a_run_of_the_train_flow_replays_bit_for_bit(prefect_api: None, tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "run": {"name": "replay-flow", "epochs": 2, "seed": 4},
            "data": {"name": "mnist1d", "samples": 600, "shards": 2},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "train": {"batch_size": 50},
            "cluster": {"workers": 1},
        }
    )
    began = time.perf_counter()
    summary = api.train(cfg, home=tmp_path)
    trained = time.perf_counter() - began
    assert summary["state"] == "completed" and summary["head_version"] == 4
    report = api.replay("replay-flow", home=tmp_path)
    assert report.bit_for_bit and report.versions == 4, report.divergence
    print(
        f"flow {trained:.1f} s, replay {report.seconds:.2f} s, training in the replay "
        f"{report.train_seconds:.2f} s (loops {report.loop_seconds:.2f} s), recorded training "
        f"{report.original_train_seconds:.2f} s"
    )
    # The replay re-trains what the fleet trained, no more.
    assert report.seconds < trained

"""A bad result is rejected, never fatal; a rewritten version is refused (issue 34, item 4).

Real SQLite ledger and local Zarr store. The groups and ledger rows are
tampered with on disk, as a dying worker (or a hand in the store) would
leave them; the worker and merge sides are the real ones. The last test
runs the train flow on a LocalCluster with results tampered with between
the worker and the merge.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from vcdl import api, cli
from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.runs import export_version, load_version, prepare_run
from vcdl.errors import ChecksumMismatch
from vcdl.ledger import Attempt
from vcdl.runtime import RunRef
from vcdl.store import WeightStore
from vcdl.views.audit import audit_run
from vcdl.worker.attempt import run_attempt


def make_run(home: Path, name: str = "bad", **sections: Any) -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": name, "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 4},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            **sections,
        }
    ).with_locations(home)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 4)
    return ref, cfg


def edit_doc(store: WeightStore, path: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a group's zarr.json in place (its chunks untouched)."""
    doc_path = Path(store.uri(path)) / "zarr.json"
    doc = json.loads(doc_path.read_bytes())
    change(doc)
    doc_path.write_text(json.dumps(doc))


def set_samples(ref: RunRef, attempt_id: str, samples: int) -> None:
    """What a broken worker would have recorded: straight into the ledger's table."""
    path = ref.ledger_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE attempt SET samples = ? WHERE id = ?", (samples, attempt_id))


def absurd_records(doc: dict[str, Any]) -> None:
    # A tensor claiming a trillion elements of its array.
    records = doc["attributes"]["vcdl"]["tensors"]
    next(iter(records.values()))["shape"] = [10**12]


def absurd_array(doc: dict[str, Any]) -> None:
    # Records and array agree on an absurd size: more than any machine's memory.
    records = doc["attributes"]["vcdl"]["tensors"]
    rec = next(r for r in records.values() if r["array"] == "float32")
    arrays = doc["consolidated_metadata"]["metadata"]
    length = arrays["float32"]["shape"][0]
    huge = 10**15
    rec["shape"] = [math_prod(rec["shape"]) + huge]
    arrays["float32"]["shape"] = [length + huge]
    arrays["float32"]["chunk_grid"]["configuration"]["chunk_shape"] = [length + huge]
    for other in records.values():
        if other is not rec and other["array"] == "float32" and other["offset"] > rec["offset"]:
            other["offset"] += huge


def overlapping_records(doc: dict[str, Any]) -> None:
    # Every tensor of the array read from its start: each one "fits".
    for rec in doc["attributes"]["vcdl"]["tensors"].values():
        rec["offset"] = 0


def garbage_table(doc: dict[str, Any]) -> None:
    doc["attributes"]["vcdl"]["tensors"] = {"x": ["not", "a", "record"]}


def math_prod(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


TAMPERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "absurd records": absurd_records,
    "absurd array": absurd_array,
    "overlapping records": overlapping_records,
    "garbage table": garbage_table,
}


def assert_rejected_then_reissued(ref: RunRef, cfg: RunConfig, att: Attempt, words: str) -> None:
    ledger = ref.ledger()
    outcome = merge_attempt(ref, att.id, cfg)
    assert outcome.kind == "rejected", outcome
    assert words in (outcome.reason or ""), outcome.reason
    recorded = ledger.get_attempt(att.id)
    assert recorded.state == "rejected" and recorded.reason == outcome.reason
    assert ledger.get_run(ref.run).head_version == 0
    # The subtask is reissued as for any rejection: a new attempt, merged.
    again = run_attempt(ref, att.epoch, att.shard, config=cfg)
    assert again.attempt_id != att.id
    assert merge_attempt(ref, str(again.attempt_id), cfg).kind == "merged"
    assert audit_run(ref, deep=True) == []


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        ("absurd records", "does not fit"),
        ("absurd array", "more than this machine's memory"),
        ("overlapping records", "overlap"),
        ("garbage table", "malformed"),
    ],
)
def test_a_result_with_a_bad_record_table_is_rejected(
    tmp_path: Path, tamper: str, words: str
) -> None:
    ref, cfg = make_run(tmp_path)
    out = run_attempt(ref, 0, 1, config=cfg)
    att = ref.ledger().get_attempt(str(out.attempt_id))
    assert att.result_uri is not None
    edit_doc(ref.store(), att.result_uri, TAMPERS[tamper])
    assert_rejected_then_reissued(ref, cfg, att, words)


@pytest.mark.parametrize(("samples", "words"), [(-5, "not positive"), (10**9, "exceeds")])
def test_a_result_reporting_a_bad_sample_count_is_rejected(
    tmp_path: Path, samples: int, words: str
) -> None:
    ref, cfg = make_run(tmp_path)
    out = run_attempt(ref, 0, 2, config=cfg)
    set_samples(ref, str(out.attempt_id), samples)
    att = ref.ledger().get_attempt(str(out.attempt_id))
    assert_rejected_then_reissued(ref, cfg, att, words)


def test_a_partial_result_with_a_negative_count_is_rejected(tmp_path: Path) -> None:
    # A partial result's count weighs its merge: a negative one made α > 1 and
    # raised out of the merge before.
    ref, cfg = make_run(tmp_path, train={"batch_size": 10})
    calls = {"n": 0}

    def stop_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    out = run_attempt(ref, 0, 3, should_stop=stop_after_three, config=cfg)
    assert out.state == "interrupted"
    set_samples(ref, str(out.attempt_id), -30)
    att = ref.ledger().get_attempt(str(out.attempt_id))
    assert_rejected_then_reissued(ref, cfg, att, "not positive")


def test_a_reduced_precision_result_with_a_bad_table_is_rejected(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path, merge={"result_precision": "int8_delta"})
    out = run_attempt(ref, 0, 0, config=cfg)
    att = ref.ledger().get_attempt(str(out.attempt_id))
    assert att.result_uri is not None
    edit_doc(ref.store(), att.result_uri, overlapping_records)
    assert_rejected_then_reissued(ref, cfg, att, "overlap")


def test_a_version_rewritten_with_valid_looking_checksums_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, cfg = make_run(tmp_path)
    first = run_attempt(ref, 0, 0, config=cfg)
    assert merge_attempt(ref, str(first.attempt_id), cfg).kind == "merged"
    waiting = run_attempt(ref, 0, 1, config=cfg)  # a result from v1, merged after the rewrite
    ledger, store = ref.ledger(), ref.store()
    head = ledger.head(ref.run)
    # Rewrite v1 with other weights: the group's own checksums match its new bytes.
    state = store.read_state(head.uri)
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = state[name] + 1.0
    store.write_state(head.uri, state, attrs=store.read_attrs(head.uri))
    assert torch.equal(store.read_state(head.uri)[name], state[name])  # valid-looking

    # Export, evaluation, the workers' base reads and the merge all refuse it.
    with pytest.raises(ChecksumMismatch, match="rewritten"):
        load_version(ref)
    out = tmp_path / "v1.pt"
    with pytest.raises(ChecksumMismatch):
        export_version(ref, out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", ref.run, "--home", str(tmp_path), "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "rewritten" in err, err
    assert not out.exists()
    with pytest.raises(ChecksumMismatch):
        run_attempt(ref, 0, 2, config=cfg)
    assert ledger.attempts(ref.run, 0)[-1].state == "failed"
    with pytest.raises(ChecksumMismatch):
        merge_attempt(ref, str(waiting.attempt_id), cfg)  # a fresh driver reads the head
    assert ledger.get_run(ref.run).head_version == 1
    # What was refused is what audit reports.
    assert any("checksum differs from the ledger's" in p for p in audit_run(ref))


# -- a run ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_with_bad_results_completes(
    prefect_api: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flows.epoch

    cfg = parse_config(
        {
            "run": {"name": "bad-run", "epochs": 2, "seed": 1},
            "data": {"name": "mnist1d", "samples": 2000, "shards": 4},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "train": {"batch_size": 100},
            "cluster": {"workers": 2},
        }
    )
    real = flows.epoch.merge_attempt
    tampered: dict[tuple[int, int], str] = {}

    def tamper(ref: RunRef, attempt_id: str, *args: Any, **kwargs: Any) -> Any:
        # Between the worker and the merge: the first result of shards 0-2 of
        # epoch 0 goes bad, each its own way.
        att = ref.ledger().get_attempt(attempt_id)
        key = (att.epoch, att.shard)
        if att.epoch == 0 and att.shard < 3 and key not in tampered and att.result_uri:
            tampered[key] = att.id
            if att.shard == 0:
                edit_doc(ref.store(), att.result_uri, absurd_records)
            elif att.shard == 1:
                edit_doc(ref.store(), att.result_uri, overlapping_records)
            else:
                set_samples(ref, att.id, -5)
        return real(ref, attempt_id, *args, **kwargs)

    monkeypatch.setattr(flows.epoch, "merge_attempt", tamper)
    summary = api.train(cfg, home=tmp_path)
    assert summary["state"] == "completed"
    assert summary["head_version"] == 8
    ref = api.run_ref("bad-run", home=tmp_path)
    ledger = ref.ledger()
    assert len(tampered) == 3
    reasons = {key: ledger.get_attempt(aid) for key, aid in tampered.items()}
    assert all(a.state == "rejected" for a in reasons.values())
    assert "does not fit" in (reasons[(0, 0)].reason or "")
    assert "overlap" in (reasons[(0, 1)].reason or "")
    assert "not positive" in (reasons[(0, 2)].reason or "")
    assert all(s.state == "merged" for s in ledger.subtasks(ref.run, 0))
    assert audit_run(ref, deep=True) == []
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["audit", ref.run, "--home", str(tmp_path)])
    assert exit_info.value.code == 0

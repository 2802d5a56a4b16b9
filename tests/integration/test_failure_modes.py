"""Each failure mode of docs/design.md §3, provoked on a real SQLite ledger and Zarr store.

No Prefect, no Dask: the worker side (run_attempt) and the merge side
(merge_attempt) are called directly, which is where the guarantees live.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.runs import clean_orphans, prepare_run
from vcdl.errors import HeadConflict, IntegrityError, LeaseHeld
from vcdl.runtime import RunRef
from vcdl.store.paths import checkpoint_path, result_path, versions_prefix
from vcdl.views.audit import audit_run
from vcdl.worker import preemption
from vcdl.worker.attempt import run_attempt
from vcdl.worker.runtime import WorkerRuntime
from vcdl.worker.slots import OWN_MERGE_WAIT


def make_run(tmp_path: Path, **merge: object) -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": "fm", "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 4},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "merge": dict(merge),
        }
    ).with_locations(tmp_path)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 4)
    return ref, cfg


def test_groups_written_but_never_recorded_are_orphans(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path)
    out = run_attempt(ref, 0, 0, config=cfg)
    ledger, store = ref.ledger(), ref.store()
    recorded = ledger.get_attempt(str(out.attempt_id)).result_uri
    assert recorded is not None
    state = store.read_state(recorded)
    # A worker killed between writing a group and recording it leaves these.
    lost = [
        result_path(ref.run, 0, 1, "a" * 32),
        checkpoint_path(ref.run, 0, 2, "b" * 32, 100),
    ]
    for path in lost:
        store.write_state(path, state)
    assert sorted(clean_orphans(ref)) == sorted(p.rsplit("/", 1)[-1] for p in lost)
    assert store.exists(recorded) and not any(store.exists(p) for p in lost)
    assert clean_orphans(ref) == []


def test_crash_between_version_write_and_head_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, cfg = make_run(tmp_path)
    out = run_attempt(ref, 0, 0, config=cfg)
    ledger, store = ref.ledger(), ref.store()

    def crash(*args: object, **kwargs: object) -> None:
        raise SystemExit("driver killed after writing the version group")

    monkeypatch.setattr(type(ledger), "commit_merge", crash)
    with pytest.raises(SystemExit):
        merge_attempt(ref, str(out.attempt_id), cfg)
    monkeypatch.undo()
    # The head did not move and still points at a complete, verified version.
    assert ledger.get_run(ref.run).head_version == 0
    assert audit_run(ref, deep=True) == []
    orphans = [n for n in store.list(versions_prefix(ref.run)) if not n.endswith("init")]
    assert len(orphans) == 1
    assert clean_orphans(ref) == orphans
    # Resume merges the same result: exactly once, lineage complete.
    outcome = merge_attempt(ref, str(out.attempt_id), cfg)
    assert outcome.kind == "merged" and outcome.version == 1
    assert audit_run(ref, deep=True) == []


def test_rerun_of_a_finished_attempt_reuses_its_result(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path)
    first = run_attempt(ref, 0, 1, config=cfg)
    # Dask re-runs a task whose worker died before its return value was fetched.
    again = run_attempt(ref, 0, 1, config=cfg)
    assert again.attempt_id == first.attempt_id and again.state == "finished"
    assert again.reused and not first.reused
    # Flagged as reused, not as a phase: timings hold seconds per phase only.
    assert again.timings == {} and "reused" not in first.timings
    assert len(ref.ledger().attempts(ref.run, 0)) == 1


def test_late_duplicate_is_recorded_never_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, cfg = make_run(tmp_path)
    first = run_attempt(ref, 0, 1, config=cfg)
    # A worker thought dead started before `first` finished, and comes back late.
    monkeypatch.setattr("vcdl.worker.attempt._unmerged_result", lambda *args: None)
    late = run_attempt(ref, 0, 1, config=cfg)
    monkeypatch.undo()
    assert merge_attempt(ref, str(first.attempt_id), cfg).kind == "merged"
    outcome = merge_attempt(ref, str(late.attempt_id), cfg)
    assert outcome.kind == "duplicate"
    ledger = ref.ledger()
    assert ledger.get_attempt(str(late.attempt_id)).state == "duplicate"
    assert [v.subtask_id for v in ledger.versions(ref.run)].count(
        ledger.get_attempt(str(first.attempt_id)).subtask_id
    ) == 1
    # A third attempt for a merged subtask does not even train.
    assert run_attempt(ref, 0, 1, config=cfg).state == "skipped"
    assert audit_run(ref) == []


@pytest.mark.parametrize("poison", ["nan", "inf", "shape", "key"])
def test_bad_result_rejected_with_reason(tmp_path: Path, poison: str) -> None:
    ref, cfg = make_run(tmp_path)
    out = run_attempt(ref, 0, 2, config=cfg)
    ledger, store = ref.ledger(), ref.store()
    att = ledger.get_attempt(str(out.attempt_id))
    assert att.result_uri is not None
    state = store.read_state(att.result_uri)
    name = next(k for k, v in state.items() if v.is_floating_point())
    if poison == "nan":
        state[name] = torch.full_like(state[name], float("nan"))
    elif poison == "inf":
        state[name] = torch.full_like(state[name], float("inf"))
    elif poison == "shape":
        state[name] = torch.zeros(3, 3)
    else:
        state["extra.weight"] = torch.zeros(1)
    store.write_state(att.result_uri, state)
    outcome = merge_attempt(ref, att.id, cfg)
    assert outcome.kind == "rejected" and outcome.reason
    recorded = ledger.get_attempt(att.id)
    assert recorded.state == "rejected" and recorded.reason == outcome.reason
    assert ledger.get_run(ref.run).head_version == 0


def test_update_norm_bound(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path, max_update_norm=1e-6)
    out = run_attempt(ref, 0, 0, config=cfg)
    outcome = merge_attempt(ref, str(out.attempt_id), cfg)
    assert outcome.kind == "rejected" and "norm" in (outcome.reason or "")


def test_corrupted_chunk_names_version_and_array(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path)
    out = run_attempt(ref, 0, 0, config=cfg)
    assert merge_attempt(ref, str(out.attempt_id), cfg).kind == "merged"
    ledger, store = ref.ledger(), ref.store()
    head = ledger.head(ref.run)
    group = Path(store.uri(head.uri))
    chunks = [p for p in group.rglob("*") if p.is_file() and p.name != "zarr.json"]
    chunk = max(chunks, key=lambda p: p.stat().st_size)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as info:
        store.read_state(head.uri)
    assert head.uri in str(info.value)
    problems = audit_run(ref)
    assert problems and head.uri.split("/")[-1] in " ".join(problems)


def test_next_attempt_claims_the_head_with_its_process_s_last_result(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path)
    worker = WorkerRuntime()  # one worker process's: b waits for a's merge
    a = run_attempt(ref, 0, 0, config=cfg, runtime=worker)
    # "The driver" merges a's result a moment after the worker recorded it.
    driver = threading.Timer(0.3, merge_attempt, args=(ref, str(a.attempt_id), cfg))
    driver.start()
    b = run_attempt(ref, 0, 1, config=cfg, runtime=worker)
    driver.join()
    assert a.base_version == 0 and b.base_version == 1, (a.base_version, b.base_version)
    assert 0.2 < b.timings["await_merge"] < OWN_MERGE_WAIT, b.timings


def test_waiting_for_the_last_merge_is_bounded(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path)
    worker = WorkerRuntime()
    run_attempt(ref, 0, 0, config=cfg, runtime=worker)  # never merged: a driver busy or gone
    b = run_attempt(ref, 0, 1, config=cfg, runtime=worker)
    assert b.base_version == 0
    assert OWN_MERGE_WAIT <= b.timings["await_merge"] < OWN_MERGE_WAIT + 0.5, b.timings
    # Pinned bases (the averaging rule) never wait.
    c = run_attempt(ref, 0, 2, base_version=0, config=cfg, runtime=worker)
    assert "await_merge" not in c.timings
    # Another process (a runtime of its own) never waits for this one's result.
    d = run_attempt(ref, 0, 3, config=cfg, runtime=WorkerRuntime())
    assert "await_merge" not in d.timings


def test_staleness_reject_policy(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path, staleness="reject", max_staleness=0)
    a = run_attempt(ref, 0, 0, config=cfg)  # both start from v0
    b = run_attempt(ref, 0, 1, config=cfg)
    assert merge_attempt(ref, str(a.attempt_id), cfg).kind == "merged"
    late = merge_attempt(ref, str(b.attempt_id), cfg)
    assert late.kind == "rejected" and "stale" in (late.reason or "")


def test_staleness_recorded(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path, staleness="raise", alpha=0.5)
    a = run_attempt(ref, 0, 0, config=cfg)
    b = run_attempt(ref, 0, 1, config=cfg)
    merge_attempt(ref, str(a.attempt_id), cfg)
    m = merge_attempt(ref, str(b.attempt_id), cfg)
    assert m.staleness == 1 and m.alpha == pytest.approx(0.75)
    assert ref.ledger().head(ref.run).staleness == 1


def test_preemption_notice_gives_partial_result(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path)
    cfg = cfg.updated(train={"batch_size": 10})
    calls = {"n": 0}

    def stop_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    out = run_attempt(ref, 0, 3, should_stop=stop_after_three, config=cfg)
    assert out.state == "interrupted" and out.samples == 30 < out.planned_samples
    att = ref.ledger().get_attempt(str(out.attempt_id))
    assert att.state == "interrupted" and att.samples == 30
    merged = merge_attempt(ref, att.id, cfg)
    assert merged.kind == "merged"


def test_sigterm_sets_the_notice() -> None:
    notice = preemption.Notice()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert notice.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert notice.received() and notice.at is not None
        notice.uninstall()
        assert signal.getsignal(signal.SIGTERM) == previous  # put back as it was
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_second_driver_is_refused(tmp_path: Path) -> None:
    ref, _ = make_run(tmp_path)
    ledger = ref.ledger()
    ledger.acquire_lease(ref.run, "host-a:1:x", ttl_seconds=60)
    with pytest.raises(LeaseHeld, match="host-a"):
        ledger.acquire_lease(ref.run, "host-b:2:y", ttl_seconds=60)


def test_a_partial_result_keeps_its_fraction_after_a_head_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head conflict makes the merge retry; the retry must blend the partial result at
    the same α as the first try (it was blended at full weight once: the result's
    planned samples were read from the wrong attributes after a retry)."""
    ref, cfg = make_run(tmp_path, alpha=0.5)
    cfg = cfg.updated(train={"batch_size": 10})
    calls = {"n": 0}

    def stop_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    out = run_attempt(ref, 0, 3, should_stop=stop_after_three, config=cfg)
    assert out.state == "interrupted" and out.planned_samples
    store, ledger = ref.store(), ref.ledger()
    att = ledger.get_attempt(str(out.attempt_id))
    assert att.result_uri is not None and att.samples == 30
    head = store.read_state(ledger.head(ref.run).uri)
    result = store.read_state(att.result_uri)
    real = type(ledger).commit_merge
    conflicts = {"n": 0}

    def conflict_once(self: object, *args: object, **kwargs: object) -> object:
        if conflicts["n"] == 0:
            conflicts["n"] += 1
            raise HeadConflict("another merger moved the head first")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(ledger), "commit_merge", conflict_once)
    merged = merge_attempt(ref, att.id, cfg)
    assert merged.kind == "merged" and merged.retries == 1, merged
    # vc_asgd at α = 0.5, the result counting for 30 of its planned samples.
    blend = 1 - (1 - 0.5) * 30 / out.planned_samples
    new = store.read_state(ledger.head(ref.run).uri)
    for key, w in head.items():
        if w.is_floating_point():
            expect = blend * w + (1 - blend) * result[key]
            torch.testing.assert_close(new[key], expect, msg=key)

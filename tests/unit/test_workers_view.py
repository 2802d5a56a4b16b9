"""``vcdl workers``: the pure rows and table (:mod:`vcdl.views.workers`), then the command
against a real SQLite ledger."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cliinproc import vcdl
from vcdl.ledger import Attempt, Ledger, Version
from vcdl.states import ATTEMPT_STATES
from vcdl.views.workers import document_text, read_workers, worker_rows, workers_text

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(aid: str, state: str, start: float, end: float | None, **kw: Any) -> Attempt:
    fields: dict[str, Any] = {
        "id": aid, "run": "r", "subtask_id": 1, "epoch": 0, "shard": 0, "number": 1,
        "worker": "tcp://10.0.0.1:4000", "base_version": 0, "state": state,
        "started_at": at(start), "finished_at": at(end) if end is not None else None,
    }  # fmt: skip
    return Attempt(**(fields | kw))


def version(number: int, aid: str, staleness: int) -> Version:
    return Version(run="r", number=number, uri=f"r/v{number}", checksum="c", parent=number - 1,
                   attempt_id=aid, staleness=staleness, created_at=at(number))  # fmt: skip


FAST = {"worker": "tcp://10.0.0.1:4000", "worker_name": "fast"}
SLOW = {"worker": "tcp://10.0.0.2:4000", "worker_name": "slow"}


def test_rows_by_hand() -> None:
    """Two named workers: the fast one merged two results (one after a restart at a new
    address), the slow one merged one and was killed once; figures worked out by hand."""
    attempts = [
        attempt("f1", "merged", 0, 10, samples=100, train_seconds=8.0, **FAST),
        attempt(
            "f2",
            "merged",
            10,
            20,
            samples=100,
            train_seconds=8.0,
            worker="tcp://10.0.0.9:4000",
            worker_name="fast",
        ),
        attempt("s1", "killed", 0, 15, **SLOW),
        attempt("s2", "merged", 15, 35, samples=100, train_seconds=20.0, **SLOW),
        attempt("s3", "running", 35, None, **SLOW),
    ]
    versions = [version(1, "f1", 0), version(2, "f2", 1), version(3, "s2", 2)]
    fast, slow = sorted(worker_rows(attempts, versions, until=at(40)), key=lambda r: r.worker)
    assert fast.worker == "fast" and fast.addresses == [
        "tcp://10.0.0.1:4000",
        "tcp://10.0.0.9:4000",
    ]
    assert (fast.attempts, fast.ends, fast.samples, fast.train_seconds) == (
        2, {"merged": 2}, 200, 16.0
    )  # fmt: skip
    assert fast.samples_per_s == pytest.approx(12.5) and fast.busy == pytest.approx(1.0)
    assert fast.staleness == pytest.approx(0.5) and fast.wasted_seconds == 0.0
    assert slow.ends == {"killed": 1, "merged": 1, "running": 1}
    assert slow.samples_per_s == pytest.approx(5.0) and slow.staleness == pytest.approx(2.0)
    # 15 + 20 + 5 (running up to `until`) over 0..40; the kill's 15 s wasted.
    assert slow.attempt_seconds == pytest.approx(40.0) and slow.busy == pytest.approx(1.0)
    assert slow.wasted_seconds == pytest.approx(15.0) and slow.speed is None
    text = workers_text("r", worker_rows(attempts, versions, at(40)))
    lines = text.splitlines()
    assert lines[0] == "run r: 2 workers" and lines[1].startswith("worker")
    assert lines[2].startswith("slow@10.0.0.2:4000 ")  # the most attempts first
    assert lines[3].startswith("fast@10.0.0.9:4000 +1 ")  # its latest address, one more
    assert "emulated" not in text


def test_idle_gaps_lower_busy_and_emulated_speeds_are_said() -> None:
    paced = '{"train": 8.0, "emulated_wait": 4.0, "emulated_speed": 0.5}'
    attempts = [
        attempt("a", "merged", 0, 10, samples=50, train_seconds=8.0, timings=paced, **SLOW),
        attempt("b", "merged", 30, 40, samples=50, train_seconds=8.0, timings=paced, **SLOW),
    ]
    (row,) = worker_rows(attempts, [], until=at(40))
    assert row.busy == pytest.approx(0.5) and row.speed == 0.5 and row.staleness is None
    text = workers_text("r", [row], epoch=3)
    assert text.startswith("run r, epoch 3: 1 worker\n") and "50 %" in text
    assert "speed: emulated (cluster.speeds)" in text


def test_unnamed_workers_are_their_address() -> None:
    (row,) = worker_rows([attempt("a", "failed", 0, 2)], [], until=at(5))
    assert row.worker == "tcp://10.0.0.1:4000" and row.addresses == [row.worker]
    assert row.samples_per_s is None and row.wasted_seconds == pytest.approx(2.0)
    assert workers_text("r", [row]).splitlines()[2].startswith("10.0.0.1:4000 ")
    assert workers_text("r", []) == "run r: no attempt yet"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(ATTEMPT_STATES)),
            st.integers(0, 3),  # worker
            st.floats(0, 100),  # start
            st.one_of(st.none(), st.floats(0, 50)),  # duration; None: running
        ),
        max_size=30,
    )
)
def test_rows_account_for_every_attempt_and_second(rows: list[Any]) -> None:
    attempts = [
        attempt(
            f"a{i}",
            state,
            start,
            None if d is None or state == "running" else start + d,
            worker=f"tcp://10.0.0.{w}:1",
            worker_name=f"w{w}",
        )
        for i, (state, w, start, d) in enumerate(rows)
    ]
    until = at(200)
    out = worker_rows(attempts, [], until)
    assert sum(r.attempts for r in out) == len(attempts)
    assert sum(sum(r.ends.values()) for r in out) == len(attempts)
    for r in out:
        assert 0.0 <= r.wasted_seconds <= r.attempt_seconds + 1e-9
        assert r.busy is None or r.busy >= 0.0
    assert [r.attempts for r in out] == sorted((r.attempts for r in out), reverse=True)
    doc = {"run": "r", "epoch": None, "workers": [r.to_dict() for r in out]}
    assert document_text(json.loads(json.dumps(doc))).startswith("run r")


# -- against a real ledger, through the command line ------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("workers")
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        ledger.create_run("r", json.dumps({"run": {"epochs": 5}}), "r/v0", "s0")
        ledger.create_run("empty", json.dumps({}), "e/v0", "s0")
        ledger.ensure_subtasks("r", 0, 2)
        first = ledger.start_attempt("r", 0, 1, "tcp://127.0.0.1:1", worker_name="0")
        ledger.abandon_attempt(first.id, state="killed", reason="worker died")
        second = ledger.start_attempt("r", 0, 1, "tcp://127.0.0.1:2", worker_name="1")
        ledger.finish_attempt(
            second.id, state="finished", result_uri="r/res", samples=30, train_seconds=3.0
        )
        ledger.commit_merge(
            "r", second.id, expected_head=0, uri="r/v1", checksum="s1", alpha=0.5, staleness=0
        )
    return tmp_path


def test_vcdl_workers_prints_a_table_and_json(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = vcdl(home, capsys, "workers", "r")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "run r: 2 workers", out
    assert any(line.startswith("0@127.0.0.1:1 ") for line in lines), out
    assert any(line.startswith("1@127.0.0.1:2 ") and " 10.0 " in line for line in lines), out
    code, out, _ = vcdl(home, capsys, "workers", "r", "--epoch", "0", "--json")
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"run", "epoch", "read_at", "workers"} and doc["epoch"] == 0
    by = {w["worker"]: w for w in doc["workers"]}
    assert by["1"]["ends"] == {"merged": 1} and by["1"]["samples_per_s"] == 10.0
    assert by["0"]["ends"] == {"killed": 1} and by["1"]["staleness"] == 0.0
    code, out, _ = vcdl(home, capsys, "workers", "empty")
    assert code == 0 and out.strip() == "run empty: no attempt yet"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "no run 'nope' in ledger"),
        (["r", "--epoch", "7"], "run 'r' has no epoch 7: its epochs are 0 (5 planned)"),
        (["empty", "--epoch", "0"], "run 'empty' has no epoch 0; none has started yet"),
    ],
)
def test_vcdl_workers_refuses_what_the_run_does_not_have(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = vcdl(home, capsys, "workers", *args)
    assert code != 0 and message in err, err


def test_read_workers_is_the_commands_document(home: Path) -> None:
    with Ledger(f"sqlite:///{home / 'ledger.db'}") as ledger:
        doc = read_workers(ledger, "r", now=at(0))
    assert doc["read_at"] == at(0).isoformat() and len(doc["workers"]) == 2

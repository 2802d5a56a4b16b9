"""The story of a subtask (vcdl/views/story.py, story_text.py and `vcdl story`).

The events are told from hand-made rows (no database) and checked for what
must hold of any history (hypothesis): in time order, every attempt's start
and end present, the merge naming its attempt and its version. The text is
checked at 100 columns; `vcdl story` against a real SQLite ledger, its
errors included.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cliinproc import vcdl
from vcdl.ledger import Attempt, Decision, Ledger, Subtask, Version
from vcdl.ledger.models import DECISIONS_PER_SUBTASK, FOLDED_CHECKSUM
from vcdl.views.artifacts import summary_markdown
from vcdl.views.story import RunStory, Story, read_story, tell
from vcdl.views.story_text import SUMMARY_LINES, offset, short_worker, story_text, timeline

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOTICE = "stopped at a batch boundary by a preemption notice"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(number: int, state: str, start: float, end: float | None, **kw: object) -> Attempt:
    fields: dict[str, Any] = {
        "id": f"a{number}", "run": "r", "subtask_id": 7, "epoch": 2, "shard": 5,
        "number": number, "worker": f"tcp://10.0.0.{number}:4000", "base_version": 3,
        "state": state, "started_at": at(start),
        "finished_at": at(end) if end is not None else None,
    }  # fmt: skip
    return Attempt(**(fields | kw))


def killed_and_reissued() -> Story:
    """Attempt 1 killed, 2 resumes its checkpoint and hands in a partial result, merged as v9."""
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state="merged", attempts=2, merged_version=9)
    rows = [
        attempt(2, "merged", 14.0, 20.0, samples=300, loss=0.5, reason=NOTICE, resumed_from="a1",
                resumed_seconds=1.5),
        attempt(1, "killed", 10.0, 12.5, reason="worker died"),
    ]  # fmt: skip
    version = Version(
        run="r", number=9, parent=8, subtask_id=7, attempt_id="a2", epoch=2, alpha=0.3,
        staleness=1, uri="v9", checksum="c", created_at=at(20.25), pruned_at=at(90.0),
    )  # fmt: skip
    return tell(sub, rows, version, T0)


def test_a_killed_and_reissued_subtask_tells_each_step() -> None:
    story = killed_and_reissued()
    steps = [(e.kind, e.attempt, e.worker, e.version, e.seconds) for e in story.events]
    assert steps == [
        ("started", 1, "tcp://10.0.0.1:4000", 3, 10.0),
        ("killed", 1, "tcp://10.0.0.1:4000", None, 12.5),
        ("reissued", 2, "tcp://10.0.0.2:4000", 3, 14.0),
        ("notice", 2, "tcp://10.0.0.2:4000", None, 20.0),  # merged, but handed in under notice
        ("merged", 2, None, 9, 20.25),
        ("pruned", None, None, 9, 90.0),
    ]
    details = [e.detail for e in story.events]
    assert details[1] == "worker died"
    assert details[2] == "from v3, resuming attempt 1's checkpoint (1.5 s trained)"
    assert details[3] == "300 samples, loss 0.5"
    assert details[4] == "alpha 0.3, staleness 1, onto v8"
    assert story.outcomes == [(1, "killed"), (2, "merged (partial)")]
    doc = story.to_dict()
    assert doc["events"][1] == {
        "at": "2026-03-01T12:00:12.500000+00:00", "seconds": 12.5, "kind": "killed",
        "attempt": 1, "worker": "tcp://10.0.0.1:4000", "version": None, "detail": "worker died",
        "worker_name": None,
    }  # fmt: skip


def test_the_timeline_is_one_line_per_event_within_100_columns() -> None:
    lines = timeline(killed_and_reissued(), "mnist1d")
    assert lines[0].startswith("epoch 2 shard 5: merged as v9, 2 attempts (run mnist1d; times")
    # One event a line, in columns: time from the run's start, attempt, what, worker, detail.
    assert lines[1:] == [
        "   +0:10.0  #1 started     10.0.0.1:4000  from v3",
        "   +0:12.5  #1 killed      10.0.0.1:4000  worker died",
        "   +0:14.0  #2 reissued    10.0.0.2:4000  from v3, resuming attempt 1's checkpoint (1.5 s trained)",  # noqa: E501
        "   +0:20.0  #2 notice      10.0.0.2:4000  partial result under notice, 300 samples, loss 0.5",  # noqa: E501
        "   +0:20.2  #2 merged v9                  alpha 0.3, staleness 1, onto v8",
        "   +1:30.0     pruned v9                  its weights let go by the retention policy (store.keep)",  # noqa: E501
    ]  # fmt: skip
    assert all(len(line) <= 100 for line in lines)


def test_rejections_failures_duplicates_and_a_closed_subtask() -> None:
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state="failed", attempts=3,
                  reason="3 attempts failed; last: RuntimeError: boom")  # fmt: skip
    rows = [
        attempt(1, "rejected", 0, 5, samples=10, reason="NaN in conv1.weight"),
        attempt(2, "duplicate", 6, 9, reason="subtask merged from another attempt"),
        attempt(3, "failed", 7, 8, reason="RuntimeError: boom"),
        attempt(4, "timeout", 10, 11, reason="past its deadline"),
        attempt(5, "running", 12, None),
    ]
    story = tell(sub, rows, None, T0)
    kinds = [e.kind for e in story.events]
    assert kinds == [
        "started", "rejected", "reissued", "reissued", "failed", "duplicate", "reissued",
        "timeout", "reissued", "closed",
    ]  # fmt: skip
    assert story.events[1].detail == "10 samples, NaN in conv1.weight"
    assert story.events[-1].detail == sub.reason and story.events[-1].seconds == 12.0
    assert story.attempts == 5  # the rows, where the subtask's count lags
    # An exception's message over two lines is told on one.
    two_lines = attempt(1, "failed", 0, 1, reason="ValueError: bad\n  at line 2")
    line = timeline(tell(sub, [two_lines], None, T0), "r")[2]
    assert line.endswith("#1 failed      10.0.0.1:4000  ValueError: bad   at line 2")


def test_a_folded_version_is_not_told_as_pruned_later() -> None:
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state="merged", attempts=1, merged_version=4)
    v = Version(run="r", number=4, subtask_id=7, attempt_id="a1", alpha=None, staleness=0,
                uri="v4", checksum=FOLDED_CHECKSUM, created_at=at(3), pruned_at=at(3))  # fmt: skip
    story = tell(sub, [attempt(1, "merged", 0, 2)], v, T0)
    assert [e.kind for e in story.events] == ["started", "returned", "merged"]
    assert "alpha unknown" in story.events[-1].detail and "folded" in story.events[-1].detail


_IDS = itertools.count(1)


def decision(kind: str, t: float, detail: str = "", worker: str | None = None) -> Decision:
    """A decision row; ids rise in the order made, as the ledger's do."""
    return Decision(id=next(_IDS), run="r", epoch=2, shard=5, kind=kind, worker=worker,
                    detail=detail, at=at(t))  # fmt: skip


W7 = "tcp://10.0.0.7:4000"
HANDED = f"handed back untrained by {W7}, under preemption notice"


def handed_back_then_merged() -> Story:
    """A worker under notice hands the task back before claiming an attempt; the reissued
    task claims attempt 1 (the first claimed), which is merged."""
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state="merged", attempts=1, merged_version=4)
    version = Version(run="r", number=4, parent=3, subtask_id=7, attempt_id="a1", alpha=0.5,
                      staleness=0, uri="v4", checksum="c", created_at=at(9.0))  # fmt: skip
    handed = decision("handed_back", 3.0, "untrained, under preemption notice", W7)
    # Recorded after the hand-back at the same moment; handed over in any order.
    decisions = [decision("reissue", 3.0, HANDED), handed]
    return tell(sub, [attempt(1, "merged", 4.0, 8.0, samples=400)], version, T0, decisions)


def test_a_task_handed_back_under_notice_and_its_reissue_are_told() -> None:
    story = handed_back_then_merged()
    steps = [(e.kind, e.attempt, e.worker, e.seconds) for e in story.events]
    assert steps == [
        ("handed_back", None, W7, 3.0),
        ("reissue", None, None, 3.0),
        ("started", 1, "tcp://10.0.0.1:4000", 4.0),
        ("returned", 1, "tcp://10.0.0.1:4000", 8.0),
        ("merged", 1, None, 9.0),
    ]
    assert story.events[1].detail == HANDED
    # A hand-back claimed no attempt: the outcomes are the attempts' alone, but the
    # subtask is eventful (a capped summary keeps it).
    assert story.outcomes == [(1, "merged")] and story.handed_back == 1 and story.eventful
    assert story.to_dict()["events"][0] == {
        "at": "2026-03-01T12:00:03+00:00", "seconds": 3.0, "kind": "handed_back",
        "attempt": None, "worker": W7, "version": None,
        "detail": "untrained, under preemption notice", "worker_name": None,
    }  # fmt: skip
    lines = timeline(story, "r")
    assert lines[1:3] == [
        "   +0:03.0     handed back 10.0.0.7:4000  untrained, under preemption notice",
        "   +0:03.0     reissuing                  because handed back untrained by tcp://10.0.0.7:4000, und…",  # noqa: E501
    ]  # fmt: skip
    assert all(len(line) <= 100 for line in lines)
    told = RunStory("r", T0, None, None, 3, [story])
    out = story_text(told)
    assert "1 task handed back under notice" in out


def test_the_reason_of_each_reissue_is_told_between_the_attempts() -> None:
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state="merged", attempts=2, merged_version=9)
    rows = [attempt(1, "timeout", 0, 900.0, reason="past its deadline"),
            attempt(2, "merged", 901.0, 950.0)]  # fmt: skip
    decisions = [decision("reissue", 900.5, "timeout after 900s")]
    story = tell(sub, rows, None, T0, decisions)
    assert [(e.kind, e.attempt) for e in story.events] == [
        ("started", 1), ("timeout", 1), ("reissue", None), ("reissued", 2), ("returned", 2),
    ]  # fmt: skip
    assert story.events[2].detail == "timeout after 900s"


def test_a_recorded_closing_has_its_own_time_and_outlives_a_later_merge() -> None:
    # Failed: the recorded closing replaces the one put after the last event.
    failed = Subtask(id=7, run="r", epoch=2, shard=5, state="failed", attempts=1, reason="boom")
    rows = [attempt(1, "failed", 0, 1, reason="RuntimeError: boom")]
    story = tell(failed, rows, None, T0, [decision("closed", 1.5, "failed: boom")])
    last = story.events[-1]
    assert (last.kind, last.seconds, last.detail) == ("closed", 1.5, "failed: boom")
    assert [e.kind for e in story.events].count("closed") == 1
    # Deferred by the quorum, then merged in the next epoch: the row says merged only.
    merged = Subtask(id=7, run="r", epoch=2, shard=5, state="merged", attempts=2, merged_version=5)
    rows = [attempt(1, "killed", 0, 60, reason="cancelled as a straggler"),
            attempt(2, "merged", 70, 80)]  # fmt: skip
    deferred = decision("closed", 60.5, "deferred: late: quorum policy")
    story = tell(merged, rows, None, T0, [deferred])
    assert ("closed", deferred.detail) in [(e.kind, e.detail) for e in story.events]


def test_the_decisions_kept_and_a_kind_this_vcdl_does_not_know() -> None:
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state="failed", attempts=0, reason="x")
    many = [decision("reissue", float(i), f"try {i}") for i in range(DECISIONS_PER_SUBTASK)]
    story = tell(sub, [], None, T0, many)
    assert story.events[DECISIONS_PER_SUBTASK - 1].detail.endswith(
        f"(the ledger keeps a subtask's first {DECISIONS_PER_SUBTASK} decisions)"
    )
    story = tell(sub, [], None, T0, [decision("rebalanced", 1.0, "moved")])
    first = story.events[0]
    assert (first.kind, first.detail) == ("decided", "rebalanced: moved")


def test_read_story_merges_the_ledgers_decisions(tmp_path: Path) -> None:
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        ledger.create_run("r", json.dumps({"run": {"epochs": 1}}), "r/v0", "c0")
        ledger.ensure_subtasks("r", 0, 2)
        ledger.record_decision("r", 0, 1, "handed_back", "untrained, under preemption notice",
                               worker=W7)  # fmt: skip
        ledger.record_decision("r", 0, 1, "reissue", HANDED)
        ledger.record_decision("r", 0, 0, "reissue", "not shard 1's")
        (story,) = read_story(ledger, "r", epoch=0, shard=1).stories
        assert [e.kind for e in story.events] == ["handed_back", "reissue"]
        assert story.events[0].worker == W7
        whole = read_story(ledger, "r")
        assert [len(s.events) for s in whole.stories] == [1, 2]


STATES = ["running", "finished", "interrupted", "killed", "timeout", "failed", "rejected",
          "duplicate"]  # fmt: skip


@st.composite
def histories(draw: st.DrawFn) -> tuple[Subtask, list[Attempt], Version | None]:
    n = draw(st.integers(0, 6))
    rows: list[Attempt] = []
    t = 0.0
    for number in range(1, n + 1):
        t += draw(st.floats(0, 100))
        state = draw(st.sampled_from(STATES))
        end = None if state == "running" else t + draw(st.floats(0, 50))
        worker, reason = draw(st.text(max_size=60)), draw(st.none() | st.text(max_size=150))
        rows.append(attempt(number, state, t, end, worker=worker, reason=reason))
    mergeable = [a for a in rows if a.state in ("finished", "interrupted")]
    version = None
    state = draw(st.sampled_from(["pending", "running", "failed", "dropped", "deferred"]))
    merge: bool = draw(st.booleans())
    if mergeable and merge:
        merged = draw(st.sampled_from(mergeable))
        merged.state = "merged"
        assert merged.finished_at is not None
        version = Version(
            run="r", number=draw(st.integers(1, 10**6)), subtask_id=7, attempt_id=merged.id,
            alpha=0.5, staleness=0, uri="v", checksum="c",
            created_at=merged.finished_at + timedelta(seconds=draw(st.floats(0, 10))),
        )  # fmt: skip
        state = "merged"
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state=state, attempts=n,
                  merged_version=version.number if version else None, reason="why")  # fmt: skip
    draw(st.randoms()).shuffle(rows)  # the rows in any order
    return sub, rows, version


@settings(max_examples=40, deadline=None)
@given(histories(), st.integers(60, 200))
def test_any_history_is_told_in_order_with_every_attempt(
    history: tuple[Subtask, list[Attempt], Version | None], width: int
) -> None:
    sub, rows, version = history
    story = tell(sub, rows, version, T0)
    times = [e.at for e in story.events]
    assert times == sorted(times)
    assert all(e.seconds == (e.at - T0).total_seconds() for e in story.events)
    for a in rows:
        mine = [e for e in story.events if e.attempt == a.number and e.kind != "merged"]
        assert mine[0].kind == ("started" if a.number == 1 else "reissued")
        assert mine[0].worker == a.worker and mine[0].version == a.base_version
        assert len(mine) == (1 if a.state == "running" else 2)
    merges = [e for e in story.events if e.kind == "merged"]
    if version is None:
        assert merges == []
    else:
        (merge,) = merges
        assert merge.version == sub.merged_version == version.number
        merged = next(a for a in rows if a.id == version.attempt_id)
        assert merge.attempt == merged.number and merged.state == "merged"
    lines = timeline(story, "r", width)
    assert len(lines) == 1 + max(len(story.events), 1)
    assert all(len(line) <= width and line.isprintable() for line in lines)


def test_offsets_and_worker_names() -> None:
    assert offset(0) == "+0:00.0" and offset(75.34) == "+1:15.3" and offset(3725.0) == "+1:02:05.0"
    assert offset(-1.25) == "-0:01.2" and offset(59.96) == "+1:00.0"
    assert short_worker("tcp://127.0.0.1:40211") == "127.0.0.1:40211" and short_worker(None) == ""
    long = short_worker("tls://" + "a" * 40 + ":1")
    assert len(long) == 22 and "…" in long and long.endswith(":1")
    # A Dask name of its own goes first; an unnamed worker's name is its address.
    assert short_worker("tcp://10.0.1.7:40123", name="spot-3") == "spot-3@10.0.1.7:40123"
    assert short_worker("tcp://10.0.1.7:4", name="tcp://10.0.1.7:4") == "10.0.1.7:4"


def test_a_named_workers_events_carry_its_name_in_the_json_and_the_text() -> None:
    sub = Subtask(id=7, run="r", epoch=2, shard=5, state="merged", attempts=1, merged_version=9)
    row = attempt(1, "finished", 1, 4, worker_name="gpu-0", result_uri="u", samples=10)
    story = tell(sub, [row], None, T0)
    assert {e.to_dict()["worker_name"] for e in story.events} == {"gpu-0"}
    assert all("gpu-0@10.0.0.1:4000" in line for line in timeline(story, "r")[1:])


def _many(n: int, eventful: set[int]) -> RunStory:
    stories = []
    for i in range(n):
        epoch, shard = divmod(i, 10)
        sub = Subtask(id=7, run="r", epoch=epoch, shard=shard, state="merged", attempts=1,
                      merged_version=i + 1)  # fmt: skip
        rows = [attempt(1, "killed", i, i + 1), attempt(2, "merged", i + 1, i + 2)]
        stories.append(tell(sub, rows if i in eventful else rows[1:], None, T0))
    return RunStory("r", T0, None, None, 12, stories)


def test_a_run_summary_is_capped_keeping_the_eventful_subtasks() -> None:
    told = _many(120, {3, 77, 118})
    lines = story_text(told).splitlines()
    assert lines[:4] == [
        "run r (times from its start)",
        "120 subtasks: 120 merged",
        "123 attempts (3 reissued): 3 killed",
        "epoch  shard  state    version  attempts  first → last event       attempts' ends",
    ]
    rows = lines[4:-2]
    assert len(rows) == SUMMARY_LINES
    assert rows[3].startswith("    0      3  merged        v4         2  +0:03.0 → +0:05.0")
    assert rows[3].endswith("#1 killed, #2 merged")
    assert any(r.startswith("   11      8 ") for r in rows)  # the last eventful one is kept
    assert lines[-2] == (
        "… 70 more not shown (70 of them merged at their first attempt); --all lists every one"
    )
    assert lines[-1] == (
        "`vcdl story r --epoch E [--shard S]`: an epoch's subtasks, or one's whole story"
    )
    assert len(story_text(told, every=True).splitlines()) == 4 + 120 + 1
    assert all(len(line) <= 100 for line in lines)


def test_an_epoch_lists_every_subtask_compactly() -> None:
    told = _many(120, {3})
    epoch = RunStory("r", T0, 0, None, 12, told.stories[:10])
    lines = story_text(epoch).splitlines()
    assert lines[0] == "run r, epoch 0 (times from its start)" and len(lines) == 4 + 10 + 1
    assert lines[4 + 3].startswith("    3  merged        v4         2")
    assert lines[-1] == "`vcdl story r --epoch 0 --shard S`: one subtask's whole story"


def test_the_prefect_summary_names_the_story_commands() -> None:
    s = {"run": "r", "state": "completed", "epochs": 2, "epochs_completed": 2, "head_version": 8,
         "data": "mnist1d", "parent_run": None, "parent_version": None}  # fmt: skip
    row = {"accuracy": 0.9, "loss": 0.3, "merges": 4, "mean_staleness": 0.0, "goodput": 1.0,
           "version": 4, "wall_seconds": 5.0}  # fmt: skip
    rows = [row | {"epoch": 0, "reissues": 1, "rejections": 0},
            row | {"epoch": 1, "reissues": 3, "rejections": 1}]  # fmt: skip
    md = summary_markdown(s, rows)
    assert "## The story of a subtask" in md
    assert "`vcdl story r --epoch E --shard S` tells everything that happened to a subtask" in md
    assert "`vcdl workers r` shows each worker's pace" in md
    assert "Epoch 1 had the most reissues (3) and 1 rejection(s): `vcdl story r --epoch 1`." in md
    assert "most reissues" not in summary_markdown(s, [row | {"epoch": 0, "reissues": 0,
                                                            "rejections": 0}])  # fmt: skip


# -- against a real ledger, through the command line ------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose ledger has run r (a killed and reissued subtask) and run empty; read only."""
    tmp_path = tmp_path_factory.mktemp("story")
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        ledger.create_run("r", json.dumps({"run": {"epochs": 5}}), "r/v0", "s0")
        ledger.create_run("empty", json.dumps({}), "e/v0", "s0")
        ledger.ensure_subtasks("r", 0, 2)
        ledger.ensure_subtasks("r", 1, 2)
        first = ledger.start_attempt("r", 0, 1, "tcp://127.0.0.1:1")
        ledger.abandon_attempt(first.id, state="killed", reason="worker died")
        second = ledger.start_attempt("r", 0, 1, "tcp://127.0.0.1:2")
        ledger.finish_attempt(second.id, state="finished", result_uri="r/res", samples=30)
        ledger.commit_merge(
            "r", second.id, expected_head=0, uri="r/v1", checksum="s1", alpha=0.62, staleness=0
        )
    return tmp_path


def test_read_story_from_the_ledger(home: Path) -> None:
    with Ledger(f"sqlite:///{home / 'ledger.db'}") as ledger:
        told = read_story(ledger, "r", epoch=0, shard=1)
        assert [e.kind for e in told.stories[0].events] == [
            "started", "killed", "reissued", "returned", "merged"
        ]  # fmt: skip
        assert told.stories[0].events[-1].version == 1 == told.stories[0].merged_version
        assert [(s.epoch, s.shard) for s in read_story(ledger, "r").stories] == [
            (0, 0), (0, 1), (1, 0), (1, 1)
        ]  # fmt: skip
        assert [s.epoch for s in read_story(ledger, "r", shard=1).stories] == [0, 1]


def test_vcdl_story_prints_a_timeline_a_listing_and_json(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = vcdl(home, capsys, "story", "r", "--epoch", "0", "--shard", "1")
    assert code == 0 and out.startswith("epoch 0 shard 1: merged as v1, 2 attempts (run r;")
    assert "#1 killed      127.0.0.1:1  worker died" in out and "#2 reissued" in out
    code, out, _ = vcdl(home, capsys, "story", "r", "--epoch", "0")
    assert code == 0 and "#1 killed, #2 merged" in out and "1 attempts" not in out
    code, out, _ = vcdl(home, capsys, "story", "r")
    assert code == 0 and out.splitlines()[1] == "4 subtasks: 1 merged, 3 pending"
    code, out, _ = vcdl(home, capsys, "story", "r", "--epoch", "0", "--shard", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"run", "started_at", "epoch", "shard", "subtasks"}
    assert (doc["epoch"], doc["shard"]) == (0, 1) and len(doc["subtasks"]) == 1
    kinds = [e["kind"] for e in doc["subtasks"][0]["events"]]
    assert kinds == ["started", "killed", "reissued", "returned", "merged"]
    assert set(doc["subtasks"][0]["events"][0]) == {
        "at", "seconds", "kind", "attempt", "worker", "version", "detail", "worker_name"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "no run 'nope' in ledger"),
        (["r", "--epoch", "7"], "run 'r' has no epoch 7: its epochs are 0-1 (5 planned)"),
        (["r", "--epoch", "-1"], "run 'r' has no epoch -1: its epochs are 0-1 (5 planned)"),
        (["r", "--epoch", "1", "--shard", "2"], "epoch 1 of run 'r' has no shard 2: its shards"),
        (["r", "--shard", "9"], "run 'r' has no shard 9: its shards are 0-1"),
        (["empty"], "run 'empty' has no subtasks yet: no epoch has started"),
        (["empty", "--epoch", "0"], "run 'empty' has no epoch 0; none has started yet"),
    ],
)  # fmt: skip
def test_what_does_not_exist_is_refused_in_one_line_naming_what_does(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = vcdl(home, capsys, "story", *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and message in err, err
    code, out, err = vcdl(home, capsys, "story", *args, "--json")
    assert code == 2 and out == "" and json.loads(err)["error"]["exit_code"] == 2

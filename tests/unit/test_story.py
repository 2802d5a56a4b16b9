"""The story of a subtask (vcdl/views/story.py), told from a real ledger's rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vcdl.cli import main
from vcdl.ledger import Ledger
from vcdl.views.story import format_stories, run_stories


def test_a_killed_and_reissued_subtask_tells_its_whole_story(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.create_run("r", json.dumps({}), "r/v0", "s0")
    ledger.ensure_subtasks("r", 0, 2)
    first = ledger.start_attempt("r", 0, 1, "worker-a")
    ledger.abandon_attempt(first.id, state="killed", reason="worker died")
    second = ledger.start_attempt("r", 0, 1, "worker-b")
    ledger.finish_attempt(second.id, state="interrupted", result_uri="r/res", samples=30)
    ledger.commit_merge(
        "r", second.id, expected_head=0, uri="r/v1", checksum="s1", alpha=0.62, staleness=0
    )
    other = ledger.start_attempt("r", 0, 0, "worker-a")
    ledger.finish_attempt(other.id, state="finished", result_uri="r/o", samples=50)
    ledger.finish_attempt(other.id, state="rejected", reason="NaN in conv1.weight")

    (story,) = run_stories(ledger, "r", epoch=0, shard=1)
    assert (story.state, story.attempts, story.merged_version) == ("merged", 2, 1)
    events = [(m.event, m.attempt, m.worker) for m in story.moments]
    assert events == [
        ("attempt started", 1, "worker-a"),
        ("attempt was killed", 1, "worker-a"),
        ("attempt started (reissued)", 2, "worker-b"),
        ("attempt returned its result", 2, "worker-b"),
        ("merged as v1", 2, None),
    ]
    assert story.moments[1].detail == "worker died" and story.moments[3].detail == "30 samples"
    assert story.moments[-1].detail == "alpha 0.620, staleness 0"
    text = format_stories(run_stories(ledger, "r"))
    assert "epoch 0 shard 1: merged, 2 attempt(s), merged as v1" in text
    assert "attempt 1 on worker-a: attempt was killed (worker died)" in text
    assert "had its result rejected (50 samples; NaN in conv1.weight)" in text
    doc = run_stories(ledger, "r")[1].to_dict()
    assert doc["events"][0]["event"] == "attempt started" and "T" in doc["events"][0]["at"]
    assert format_stories([]) == "no subtask matches"
    ledger.close()


def test_vcdl_story_prints_the_timeline_and_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_run("r", json.dumps({}), "r/v0", "s0")
    ledger.ensure_subtasks("r", 0, 2)
    a = ledger.start_attempt("r", 0, 0, "w1")
    ledger.abandon_attempt(a.id, state="timeout", reason="past its deadline")
    ledger.close()
    home = ["--home", str(tmp_path)]

    def vcdl(*args: str) -> int | str | None:
        with pytest.raises(SystemExit) as ended:
            main([*args, *home])
        return ended.value.code

    assert vcdl("story", "r", "--epoch", "0", "--shard", "0") in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("epoch 0 shard 0: running, 1 attempt(s)")
    assert "attempt 1 on w1: attempt timed out (past its deadline)" in out
    assert vcdl("story", "r", "--json") in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert [s["shard"] for s in doc["subtasks"]] == [0, 1] and doc["subtasks"][1]["events"] == []
    assert vcdl("story", "nope") == 2 and "no run 'nope'" in capsys.readouterr().err

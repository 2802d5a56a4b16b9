"""Pure parts of the artifacts and the retrain flow: tables, plots, skip decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vcdl.driver.retrain import latest_descendant, pick_version, retrain_decision
from vcdl.ledger import Attempt, Evaluation, Run, Subtask, Version
from vcdl.views.artifacts import (
    artifact_key,
    dollars,
    epoch_metrics,
    png_data_uri,
    progress_percent,
    progress_png,
    seconds,
    significant,
    summary_markdown,
    usd,
)
from vcdl.views.epochs import epoch_views

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _attempt(epoch: int, shard: int, state: str, seconds: float, n: int = 1) -> Attempt:
    return Attempt(
        run="r", subtask_id=epoch * 10 + shard, epoch=epoch, shard=shard, number=n,
        worker="w", base_version=0, state=state, train_seconds=seconds,
    )  # fmt: skip


def test_epoch_metrics_from_ledger_rows() -> None:
    subtasks = [
        Subtask(run="r", epoch=0, shard=0, state="merged", attempts=1),
        Subtask(run="r", epoch=0, shard=1, state="merged", attempts=3),
        Subtask(run="r", epoch=1, shard=0, state="merged", attempts=1),
        Subtask(run="r", epoch=1, shard=1, state="pending", attempts=1),
    ]
    attempts = [
        _attempt(0, 0, "merged", 3.0),
        _attempt(0, 1, "killed", 1.0),
        _attempt(0, 1, "rejected", 2.0, 2),
        _attempt(0, 1, "merged", 2.0, 3),
        _attempt(1, 0, "merged", 4.0),
    ]
    versions = [
        Version(run="r", number=0, uri="v0", checksum="c"),
        Version(run="r", number=1, epoch=0, staleness=0, uri="v1", checksum="c"),
        Version(run="r", number=2, epoch=0, staleness=1, uri="v2", checksum="c"),
        Version(run="r", number=3, epoch=1, staleness=0, uri="v3", checksum="c"),
    ]
    evals = [
        Evaluation(run="r", version=2, epoch=0, split="test", accuracy=0.5, loss=1.5,
                   samples=10, created_at=T0 + timedelta(seconds=12)),
        Evaluation(run="r", version=2, epoch=0, split="train", accuracy=0.9, loss=0.1,
                   samples=10, created_at=T0),
    ]  # fmt: skip
    views = epoch_views(subtasks, attempts, versions, evals)
    rows = epoch_metrics(views, started=T0)
    assert rows[0] == {
        "epoch": 0,
        "accuracy": 0.5,
        "loss": 1.5,
        "merges": 2,
        "reissues": 2,
        "rejections": 1,
        "mean_staleness": 0.5,
        "goodput": round(5 / 8, 4),
        "version": 2,
        "wall_seconds": 12.0,
        "data_bytes": 0,
        "written_bytes": 0,
    }
    assert rows[1]["epoch"] == 1 and rows[1]["accuracy"] is None and rows[1]["merges"] == 1
    assert rows[1]["goodput"] == 1.0 and rows[1]["wall_seconds"] is None
    assert "cost_usd" not in rows[0]

    history = [{"epoch": 0, "total_usd": 0.0123456, "waste_usd": 0.001}]
    priced = epoch_metrics(views, started=T0, costs=history)
    assert (priced[0]["cost_usd"], priced[0]["waste_usd"]) == (0.01235, 0.001)
    tiny = epoch_metrics(views, costs=[{"epoch": 0, "total_usd": 6.8544e-06, "waste_usd": 0.0}])
    assert (tiny[0]["cost_usd"], tiny[0]["waste_usd"]) == (6.854e-06, 0.0)
    big = epoch_metrics(views, costs=[{"epoch": 0, "total_usd": 12.3456, "waste_usd": 1.004}])
    assert (big[0]["cost_usd"], big[0]["waste_usd"]) == (12.35, 1.0)
    assert (priced[1]["cost_usd"], priced[1]["waste_usd"]) == (None, None)  # not priced yet


def test_progress_percent() -> None:
    assert progress_percent(0, 8) == 0.0
    assert progress_percent(3, 8) == 37.5
    assert progress_percent(9, 8) == 100.0
    assert progress_percent(0, 0) == 100.0


def test_artifact_key_is_prefect_safe() -> None:
    assert artifact_key("vcdl", "My_Run.v2", "epoch", 3) == "vcdl-my-run-v2-epoch-3"


def test_summary_markdown_has_lineage_plot_and_export() -> None:
    s = {
        "run": "child", "state": "completed", "epochs": 1, "epochs_completed": 1,
        "head_version": 4, "test_accuracy": 0.9, "data": "mnist1d",
        "parent_run": "parent", "parent_version": 8,
    }  # fmt: skip
    rows = [
        {"epoch": 0, "accuracy": 0.9, "loss": 0.3, "merges": 4, "reissues": 0,
         "rejections": 0, "mean_staleness": 0.25, "goodput": 1.0, "version": 4,
         "wall_seconds": 5.0},
    ]  # fmt: skip
    png = progress_png(rows, "t")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    md = summary_markdown(
        s, rows, "/store/runs/child/plots/progress.png", png_data_uri(png), "sha256:ab"
    )
    assert "run `parent` version v8" in md and "sha256:ab" in md
    assert "| 0 | 0.9000 | 0.3000 | 4 | 0 | 0 | 0.25 | 100.0% | 4 | 5.0 |" in md
    assert "](data:image/png;base64," in md and "vcdl export child" in md
    fresh = summary_markdown({**s, "parent_run": None, "parent_version": None})
    assert "fresh initialization" in fresh
    assert "## Cost" not in fresh and "spot $" not in fresh


def test_summary_markdown_shows_cost() -> None:
    s = {
        "run": "r", "state": "completed", "epochs": 1, "epochs_completed": 1,
        "head_version": 4, "test_accuracy": 0.9, "data": "mnist1d",
        "parent_run": None, "parent_version": None,
    }  # fmt: skip
    rows = [
        {"epoch": 0, "accuracy": 0.9, "loss": 0.3, "merges": 4, "reissues": 1,
         "rejections": 0, "mean_staleness": 0.25, "goodput": 0.8, "version": 4,
         "wall_seconds": 5.0, "cost_usd": 0.0125, "waste_usd": 0.0025},
    ]  # fmt: skip
    cost = {
        "run": "r", "total_usd": 0.0125, "worker_seconds": 120.0, "attempts": 5, "merged": 4,
        "waste_usd": 0.0025, "waste_share": 0.2, "on_demand_equivalent_usd": 0.03,
        "on_demand_merged_usd": 0.024, "realized_savings": 0.479, "spot_discount": 0.583,
        "savings_gap_points": 10.4, "usd_per_merged_sample": 0.0125 / 4000,
        "instance_types": {"g4dn.xlarge": {"spot_per_hour": 0.2104, "on_demand_per_hour": 0.526}},
        "prices_as_of": "2026-11-01", "upper_bound_seconds": 3.0,
    }  # fmt: skip
    md = summary_markdown(s, rows, cost=cost)
    assert "| 80.0% | 4 | 5.0 | 0.0 | 0.0 | 0.0125 | 0.0025 |" in md
    assert "## Log and metrics" not in md
    assert "spot $ | wasted $ |" in md and "## Cost" in md
    assert "Spot cost **$0.0125**" in md and "wasted $0.0025 (20.0%)" in md
    assert "Realized savings **47.9%** against a spot discount of 58.3%" in md
    assert "(waste cost 10.4 points)" in md and "$3.12 per million merged samples" in md
    assert "`g4dn.xlarge` (spot $0.2104/h" in md and "`vcdl cost r`" in md
    tiny = summary_markdown(s, rows, cost={**cost, "total_usd": 6.8544e-06, "waste_usd": 0.0})
    assert "Spot cost **$6.854e-06**" in tiny and "wasted $0 " in tiny
    linked = summary_markdown(
        s, rows, log_file="/h/logs/r.log", metrics_url="http://127.0.0.1:9108/metrics"
    )
    assert "## Log and metrics" in linked and "`/h/logs/r.log`" in linked
    assert "<http://127.0.0.1:9108/metrics>" in linked


def test_artifact_numbers_are_rounded_for_reading() -> None:
    assert significant(2.1037281799316405) == 2.104
    assert significant(0.902777) == 0.9028 and significant(1234567.0) == 1235000.0
    assert significant(None) is None and significant(0.0) == 0.0
    assert seconds(12.34567) == 12.3 and seconds(None) is None
    assert usd(12.3456) == 12.35 and usd(0.0123456) == 0.01235 and usd(6.8544e-06) == 6.854e-06
    assert dollars(12.3456) == "$12.35" and dollars(0.0123456) == "$0.01235"
    assert dollars(6.8544e-06) == "$6.854e-06" and dollars(0.0) == "$0"
    # A table row from a loss of many digits shows four.
    views = epoch_views(
        [Subtask(run="r", epoch=0, shard=0, state="merged", attempts=1)],
        [_attempt(0, 0, "merged", 3.0)],
        [Version(run="r", number=1, epoch=0, staleness=0, uri="v1", checksum="c")],
        [
            Evaluation(run="r", version=1, epoch=0, split="test", accuracy=0.90277777,
                       loss=2.1037281799316405, samples=10,
                       metrics='{"loss": 2.1037281799316405, "perplexity": 8.19876}',
                       created_at=T0 + timedelta(seconds=12.3456)),
        ],
    )  # fmt: skip
    (row,) = epoch_metrics(views, started=T0)
    assert (row["accuracy"], row["loss"], row["wall_seconds"]) == (0.9028, 2.104, 12.3)
    assert row["perplexity"] == 8.199


def test_retrain_decision() -> None:
    assert retrain_decision("sha256:a", "sha256:a").skip
    assert not retrain_decision("sha256:a", "sha256:a", force=True).skip
    assert not retrain_decision("sha256:a", "sha256:b").skip
    d = retrain_decision("sha256:a", None)
    assert not d.skip and "unknown" in d.reason


def _run(name: str, parent: str | None, minutes: int, state: str = "completed") -> Run:
    return Run(
        name=name, config="{}", state=state, parent_run=parent,
        parent_version=0 if parent else None, created_at=T0 + timedelta(minutes=minutes),
    )  # fmt: skip


def test_latest_descendant_follows_the_lineage() -> None:
    runs = [
        _run("root", None, 0),
        _run("r1", "root", 1),
        _run("r2", "r1", 2),
        _run("r3", "r2", 3, state="failed"),
        _run("other", None, 4),
        _run("other-r", "other", 5),
    ]
    assert latest_descendant(runs, "root").name == "r2"  # type: ignore[union-attr]
    assert latest_descendant(runs, "r2").name == "r2"  # type: ignore[union-attr]
    assert latest_descendant(runs, "missing") is None
    assert latest_descendant([_run("x", None, 0, "running")], "x").name == "x"  # type: ignore[union-attr]


def test_pick_version() -> None:
    evals = [
        Evaluation(run="r", version=2, split="test", accuracy=0.8, loss=1, samples=1),
        Evaluation(run="r", version=4, split="test", accuracy=0.7, loss=1, samples=1),
        Evaluation(run="r", version=3, split="train", accuracy=0.99, loss=1, samples=1),
    ]
    assert pick_version("head", 4, evals) == 4
    assert pick_version("best", 4, evals) == 2
    assert pick_version(3, 4, evals) == 3
    assert pick_version("best", 4, []) == 4
    with pytest.raises(ValueError):
        pick_version("newest", 4, evals)

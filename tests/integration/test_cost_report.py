"""vcdl.views.cost.cost_report on a real SQLite ledger with a controlled clock.

Every timestamp the ledger writes comes from ``vcdl.ledger.utcnow``; the test
replaces it with a clock it advances by hand, so each attempt's wall time is
known exactly and the report's dollars can be checked to the cent.

The run (two epochs, two shards; prices per second are round numbers):

    epoch 0 shard 0  A  w1 small   0- 600  merged
    epoch 0 shard 1  B  w2 small   0- 300  killed (recorded)
                     C  w1 small 600-1200  merged
                     D  w2 small 300-1100  duplicate (C merged first)
    epoch 1 shard 0  E  w3 large 1200-1800 merged
    epoch 1 shard 1  F  w2 small 1200-     never recorded (SIGKILLed): counted
                                           to the run's updated_at (2400)
                     G  w1 small 1500-2100 merged
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from vcdl.errors import AlreadyMerged, ConfigError, RunNotFound
from vcdl.ledger import Ledger
from vcdl.ledger import models as ledger_models
from vcdl.views.cost import cost_report, format_cost
from vcdl.views.prices import PriceTable, load_prices

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SMALL = 0.36 / 3600  # spot USD per second; on demand 1.0/h
LARGE = 1.8 / 3600  # on demand 3.6/h
WORKER_TYPES = {"tcp://w3:*": "large"}


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def at(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self) -> datetime:
        return T0 + timedelta(seconds=self.seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(ledger_models, "utcnow", c)  # the clock every ledger write reads
    return c


@pytest.fixture
def prices(tmp_path: Path) -> PriceTable:
    path = tmp_path / "prices.toml"
    path.write_text(
        '[meta]\nas_of = "test"\n'
        "[instance.small]\non_demand = 1.0\nspot = 0.36\n"
        "[instance.large]\non_demand = 3.6\nspot = 1.8\n"
    )
    return load_prices(path, defaults=False)


@pytest.fixture
def ledger(tmp_path: Path, clock: Clock) -> Iterator[Ledger]:
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    clock.at(0)
    led.create_run("r", json.dumps({"x": 1}), "r/v0", "c0")
    yield led
    led.close()


def play(led: Ledger, clock: Clock, *, complete: bool = True) -> None:
    """Record the run of the module docstring."""
    led.ensure_subtasks("r", 0, 2)

    def finish(aid: str, t: float, state: str = "finished", samples: int | None = 500) -> None:
        clock.at(t)
        led.finish_attempt(aid, state=state, samples=samples, result_uri=f"res/{aid}")

    def merge(aid: str, t: float, head: int) -> None:
        clock.at(t)
        led.commit_merge(
            "r", aid, expected_head=head, uri=f"r/v{head + 1}", checksum="c", alpha=0.5, staleness=0
        )

    clock.at(0)
    a = led.start_attempt("r", 0, 0, "tcp://w1:1")
    b = led.start_attempt("r", 0, 1, "tcp://w2:1")
    clock.at(300)
    finish(b.id, 300, "killed", samples=None)
    d = led.start_attempt("r", 0, 1, "tcp://w2:1")
    finish(a.id, 600)
    merge(a.id, 610, 0)  # finished_at stays 600
    clock.at(600)
    c = led.start_attempt("r", 0, 1, "tcp://w1:1")
    finish(d.id, 1100)
    finish(c.id, 1200)
    merge(c.id, 1200, 1)
    with pytest.raises(AlreadyMerged):
        merge(d.id, 1210, 2)
    assert led.get_attempt(d.id).state == "duplicate"

    led.ensure_subtasks("r", 1, 2)
    clock.at(1200)
    e = led.start_attempt("r", 1, 0, "tcp://w3:1")
    led.start_attempt("r", 1, 1, "tcp://w2:1")  # F: never heard of again
    clock.at(1500)
    g = led.start_attempt("r", 1, 1, "tcp://w1:1")
    finish(e.id, 1800)
    merge(e.id, 1800, 2)
    finish(g.id, 2100)
    merge(g.id, 2100, 3)
    if complete:
        clock.at(2400)
        led.update_run("r", state="running")
        led.update_run("r", state="completed", epochs_completed=2)


def test_cost_report_of_a_finished_run(ledger: Ledger, clock: Clock, prices: PriceTable) -> None:
    play(ledger, clock)
    r = cost_report(ledger, "r", prices, instance_type="small", worker_types=WORKER_TYPES)
    assert (r["run"], r["state"], r["prices_as_of"]) == ("r", "completed", "test")
    assert (r["attempts"], r["merged"]) == (7, 4)
    # small: merged A, C, G 1800 s; waste B 300 + D 800 + F 1200 (upper bound); large: E 600 s
    assert r["worker_seconds"] == pytest.approx(4700)
    assert r["merged_seconds"] == pytest.approx(2400)
    assert r["waste_seconds"] == pytest.approx(2300)
    assert r["pending_seconds"] == 0
    assert r["upper_bound_seconds"] == pytest.approx(1200)
    assert r["total_usd"] == pytest.approx(4100 * SMALL + 600 * LARGE)  # 0.71
    assert r["waste_usd"] == pytest.approx(2300 * SMALL)  # 0.23
    assert r["useful_usd"] == pytest.approx(0.48)
    assert r["waste_share"] == pytest.approx(0.23 / 0.71)
    assert r["merged_samples"] == 2000
    assert r["usd_per_merged_sample"] == pytest.approx(0.71 / 2000)
    assert r["on_demand_equivalent_usd"] == pytest.approx(4100 / 3600 + 0.6)
    assert r["on_demand_merged_usd"] == pytest.approx(1800 / 3600 + 0.6)  # 1.1
    assert r["savings_usd"] == pytest.approx(1.1 - 0.71)
    assert r["realized_savings"] == pytest.approx(1 - 0.71 / 1.1)
    assert r["spot_discount"] == pytest.approx(1 - 0.71 / (4100 / 3600 + 0.6))
    assert r["savings_gap_points"] == pytest.approx(
        100 * (r["spot_discount"] - r["realized_savings"])
    )
    small, large = r["instance_types"]["small"], r["instance_types"]["large"]
    assert (small["attempts"], large["attempts"]) == (6, 1)
    assert small["discount"] == pytest.approx(0.64) and large["discount"] == pytest.approx(0.5)
    assert large["total_usd"] == pytest.approx(0.3) and large["waste_usd"] == 0
    e0, e1 = r["history"]
    assert (e0["epoch"], e0["attempts"], e0["merged"]) == (0, 4, 2)
    assert e0["total_usd"] == pytest.approx(2300 * SMALL)
    assert e0["waste_usd"] == pytest.approx(1100 * SMALL)
    assert (e1["epoch"], e1["attempts"], e1["merged"]) == (1, 3, 2)
    assert e1["total_usd"] == pytest.approx(600 * LARGE + 1800 * SMALL)
    assert e1["waste_usd"] == pytest.approx(1200 * SMALL)
    assert e1["realized_savings"] == pytest.approx(1 - 0.48 / (0.6 + 600 / 3600))
    text = format_cost(r)
    assert "realized savings 35.5%" in text and "large" in text and "1200 s upper-bound" in text
    json.dumps(r)  # plain data, ready for --json output


def test_running_run_has_pending_attempts(ledger: Ledger, clock: Clock, prices: PriceTable) -> None:
    play(ledger, clock, complete=False)
    until = T0 + timedelta(seconds=3000)
    r = cost_report(
        ledger, "r", prices, instance_type="small", worker_types=WORKER_TYPES, until=until
    )
    assert r["state"] == "created"
    # F (running since 1200) is pending, counted to `until`: 1800 s.
    assert r["pending_seconds"] == pytest.approx(1800)
    assert r["pending_usd"] == pytest.approx(1800 * SMALL)
    assert r["waste_usd"] == pytest.approx(1100 * SMALL)
    assert r["upper_bound_seconds"] == pytest.approx(1800)
    assert r["realized_savings"] == pytest.approx(1 - (0.48 + 1100 * SMALL) / 1.1)
    # Default end for open attempts: the run's updated_at (the last merge, 2100).
    r2 = cost_report(ledger, "r", prices, instance_type="small", worker_types=WORKER_TYPES)
    assert r2["pending_seconds"] == pytest.approx(900)


def test_default_prices_and_errors(ledger: Ledger, clock: Clock) -> None:
    play(ledger, clock)
    r = cost_report(ledger, "r")  # vcdl's list prices, every worker a g4dn.xlarge
    assert list(r["instance_types"]) == ["g4dn.xlarge"]
    g4dn = load_prices()["g4dn.xlarge"]
    assert r["total_usd"] == pytest.approx(4700 / 3600 * g4dn.spot)
    assert r["spot_discount"] == pytest.approx(g4dn.discount)
    assert r["prices_as_of"] and r["prices_source"]
    with pytest.raises(RunNotFound):
        cost_report(ledger, "ghost")
    with pytest.raises(ConfigError, match="no price for instance type 'h100'"):
        cost_report(ledger, "r", instance_type="h100")


def test_run_cost_report_follows_the_runs_cost_section(
    ledger: Ledger, clock: Clock, prices: PriceTable, tmp_path: Path
) -> None:
    from vcdl.config import CostSection
    from vcdl.views.cost import run_cost_report
    from vcdl.views.prices import run_prices

    play(ledger, clock)
    cost = CostSection(
        instance_type="small",
        prices=str(tmp_path / "prices.toml"),  # the fixture's file
        worker_types=dict(WORKER_TYPES),
    )
    got = run_cost_report(ledger, "r", cost)
    want = cost_report(
        ledger,
        "r",
        load_prices(tmp_path / "prices.toml"),
        instance_type="small",
        worker_types=WORKER_TYPES,
    )
    assert got == want and set(got["instance_types"]) == {"small", "large"}
    with pytest.raises(ConfigError, match="no price for instance type 'h100'"):
        run_prices(CostSection(instance_type="h100"))
    with pytest.raises(ConfigError, match="no price for instance type 'tiny'"):
        run_prices(CostSection(worker_types={"tcp://*": "tiny"}))

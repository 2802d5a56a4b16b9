"""Unit tests for vcdl.views.cost: price tables, attempt cost, the cost summary."""

from __future__ import annotations

import math
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.errors import ConfigError
from vcdl.ledger import Attempt
from vcdl.states import ATTEMPT_STATES
from vcdl.views.cost import attempt_cost, attempt_seconds, cost_summary, format_cost, outcome
from vcdl.views.goodput import salvaged_attempts, training_seconds, useful_training_seconds
from vcdl.views.prices import PriceTable, default_prices, instance_for, load_prices, parse_prices

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PROPS = settings(max_examples=60, deadline=None)

TABLE = parse_prices(
    {
        "meta": {"as_of": "test"},
        "instance": {
            "cheap": {"on_demand": 1.0, "spot": 0.3},
            "big": {"on_demand": 4.0, "spot": 2.0},
        },
    }
)


def attempt(
    state: str = "merged",
    seconds: float | None = 3600.0,
    *,
    epoch: int = 0,
    worker: str = "tcp://10.0.0.1:1",
    samples: int | None = 100,
    start: float = 0.0,
) -> Attempt:
    started = T0 + timedelta(seconds=start)
    return Attempt(
        run="r",
        subtask_id=1,
        epoch=epoch,
        shard=0,
        number=1,
        worker=worker,
        base_version=0,
        state=state,
        samples=samples,
        started_at=started,
        finished_at=None if seconds is None else started + timedelta(seconds=seconds),
    )


def summary(attempts: list[Attempt], **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"until": T0 + timedelta(hours=10), "run_ended": True}
    args |= kw
    args.setdefault("instance_type", "cheap")
    return cost_summary(attempts, TABLE, **args)


# -- prices ---------------------------------------------------------------------


def test_default_prices_are_sane_and_dated() -> None:
    table = default_prices()
    for kind in ("g4dn.xlarge", "g5.xlarge", "g6.xlarge", "p3.2xlarge", "a2-highgpu-1g"):
        price = table[kind]
        assert 0 < price.spot < price.on_demand
        assert 0.3 < price.discount < 0.9
    assert table.as_of and "pricing" in table.source
    assert table.currency == "USD"
    assert load_prices().prices == table.prices


def test_user_file_overrides_and_extends(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        '[meta]\nas_of = "2030-01-01"\n'
        '[instance."g4dn.xlarge"]\nspot = 0.1\n'
        '[instance."home-gpu"]\non_demand = 0.5\nspot = 0.05\nnote = "electricity"\n'
    )
    table = load_prices(path)
    assert table["g4dn.xlarge"].spot == 0.1
    assert table["g4dn.xlarge"].on_demand == default_prices()["g4dn.xlarge"].on_demand
    assert table["home-gpu"].discount == pytest.approx(0.9)
    assert "g5.xlarge" in table and table.as_of == "2030-01-01"
    # Without the defaults, the partial g4dn.xlarge entry has no on_demand price.
    with pytest.raises(ConfigError, match=r"g4dn.xlarge.*missing \['on_demand'\]"):
        load_prices(path, defaults=False)
    alone = tmp_path / "alone.toml"
    alone.write_text('[instance."home-gpu"]\non_demand = 0.5\nspot = 0.05\n')
    only = load_prices(alone, defaults=False)
    assert list(only.prices) == ["home-gpu"] and only.as_of == ""


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"on_demand": -1.0, "spot": 0.1}, "non-negative"),
        ({"on_demand": 1.0, "spot": -0.1}, "non-negative"),
        ({"on_demand": 1.0, "spot": math.nan}, "finite"),
        ({"on_demand": 1.0, "spot": math.inf}, "finite"),
        ({"on_demand": "1.0", "spot": 0.1}, "must be a number"),
        ({"on_demand": True, "spot": 0.1}, "must be a number"),
        ({"on_demand": 0, "spot": 0}, "must be > 0"),
        ({"on_demand": 1.0}, "missing"),
        ({"on_demand": 1.0, "spot": 0.5, "sopt": 0.4}, "unknown field"),
        ({"on_demand": 1.0, "spot": 0.5, "region": 3}, "region must be a string"),
    ],
)
def test_bad_price_entries_are_config_errors(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_prices({"instance": {"x": entry}}, "bad.toml")


def test_bad_documents_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown table"):
        parse_prices({"instances": {}})
    with pytest.raises(ConfigError, match=r"\[meta\]"):
        parse_prices({"meta": {"date": "x"}})
    with pytest.raises(ConfigError, match="not found"):
        load_prices(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[instance\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_prices(broken)
    with pytest.raises(ConfigError, match=r"no price for instance type 'tpu'.*known: big, cheap"):
        TABLE["tpu"]


def test_spot_above_on_demand_is_allowed_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="savings will be negative"):
        table = parse_prices({"instance": {"x": {"on_demand": 1.0, "spot": 1.2}}})
    assert table["x"].discount == pytest.approx(-0.2)


def test_default_file_loads_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        default_prices()


# -- attempts -------------------------------------------------------------------


def test_instance_for_first_matching_glob_wins() -> None:
    types = {"tcp://10.0.1.*": "big", "tcp://10.0.*": "cheap"}
    assert instance_for("tcp://10.0.1.7:4000", "x", types) == "big"
    assert instance_for("tcp://10.0.2.7:4000", "x", types) == "cheap"
    assert instance_for("tcp://192.168.0.1:1", "x", types) == "x"
    assert instance_for("anything", "x", None) == "x"


def test_instance_for_matches_a_workers_dask_name_as_well() -> None:
    """A spot replacement comes back at a new address under the name its launcher
    gives it: a glob on the name prices it the same; an address glob still wins first."""
    types = {"tcp://10.0.9.*": "pinned", "gpu-*": "g5.xlarge"}
    assert instance_for("tcp://10.0.3.4:4000", "cpu", types, name="gpu-2") == "g5.xlarge"
    assert instance_for("tcp://10.0.9.1:4000", "cpu", types, name="gpu-2") == "pinned"
    assert instance_for("tcp://10.0.3.4:4000", "cpu", types, name="cpu-1") == "cpu"
    assert instance_for("tcp://10.0.3.4:4000", "cpu", types) == "cpu"  # no name recorded
    named = attempt(worker="tcp://10.0.3.4:1").model_copy(update={"worker_name": "big-7"})
    s = summary([named, attempt()], worker_types={"big-*": "big"})
    assert s["instance_types"]["big"]["attempts"] == 1, s["instance_types"]
    assert s["instance_types"]["cheap"]["attempts"] == 1, s["instance_types"]


@PROPS
@given(
    a=st.floats(0, 1e7, allow_nan=False),
    b=st.floats(0, 1e7, allow_nan=False),
    price=st.floats(0, 100, allow_nan=False),
)
def test_attempt_cost_is_monotone_in_seconds(a: float, b: float, price: float) -> None:
    lo, hi = sorted((a, b))
    assert 0 <= attempt_cost(lo, price) <= attempt_cost(hi, price)


def test_attempt_cost_values_and_errors() -> None:
    assert attempt_cost(3600, 0.526) == pytest.approx(0.526)
    assert attempt_cost(90, 2.0) == pytest.approx(0.05)
    for bad in ((-1, 1.0), (1, -1.0), (math.nan, 1.0), (1, math.inf)):
        with pytest.raises(ValueError):
            attempt_cost(*bad)


def test_attempt_seconds_upper_bound_and_clamp() -> None:
    until = T0 + timedelta(seconds=500)
    assert attempt_seconds(attempt(seconds=120), until) == (120.0, False)
    assert attempt_seconds(attempt(seconds=None, start=100), until) == (400.0, True)
    assert attempt_seconds(attempt(seconds=None, start=900), until) == (0.0, True)
    assert attempt_seconds(attempt(seconds=-5), until) == (0.0, False)


def test_every_attempt_state_has_an_outcome() -> None:
    for state in ATTEMPT_STATES:
        assert outcome(state, run_ended=True) in ("useful", "waste")
        assert outcome(state, run_ended=False) in ("useful", "waste", "pending")
    assert outcome("merged", True) == "useful"
    assert outcome("finished", False) == "pending" and outcome("finished", True) == "waste"
    for state in ("killed", "timeout", "rejected", "duplicate", "failed"):
        assert outcome(state, False) == "waste"


# -- the summary ----------------------------------------------------------------

seconds_lists = st.lists(st.floats(1, 1e5, allow_nan=False), min_size=1, max_size=20)


@PROPS
@given(seconds=seconds_lists)
def test_all_merged_means_no_waste_and_savings_equal_the_discount(seconds: list[float]) -> None:
    s = summary([attempt("merged", t) for t in seconds])
    assert s["waste_usd"] == 0 and s["waste_share"] == 0
    assert s["spot_discount"] == pytest.approx(0.7)
    assert s["realized_savings"] == pytest.approx(0.7)
    assert s["savings_gap_points"] == pytest.approx(0, abs=1e-9)
    assert s["total_usd"] == pytest.approx(sum(seconds) / 3600 * 0.3)


@PROPS
@given(useful=seconds_lists, wasted=seconds_lists)
def test_waste_lowers_realized_savings_below_the_discount(
    useful: list[float], wasted: list[float]
) -> None:
    s = summary([attempt("merged", t) for t in useful] + [attempt("killed", t) for t in wasted])
    share = sum(wasted) / (sum(useful) + sum(wasted))
    assert s["waste_share"] == pytest.approx(share)
    # 1 - spot*(U+W) / (od*U) with spot/od = 0.3
    expected = 1 - 0.3 * (sum(useful) + sum(wasted)) / sum(useful)
    assert s["realized_savings"] == pytest.approx(expected)
    assert s["realized_savings"] < s["spot_discount"] == pytest.approx(0.7)
    assert s["savings_usd"] == pytest.approx(
        sum(useful) / 3600 * 1.0 - (sum(useful) + sum(wasted)) / 3600 * 0.3
    )


def test_summary_numbers_by_hand() -> None:
    attempts = [
        attempt("merged", 3600, epoch=0, samples=1000),
        attempt("killed", 1800, epoch=0, samples=None),
        attempt("duplicate", 3600, epoch=0, worker="tcp://big-1:1", samples=1000),
        attempt("merged", 7200, epoch=1, worker="tcp://big-2:1", samples=3000),
        attempt("running", None, epoch=1, start=9 * 3600, samples=None),  # 1 h to `until`
    ]
    s = summary(attempts, worker_types={"tcp://big-*": "big"}, run_ended=True)
    # cheap: 1 h merged + 0.5 h killed + 1 h running(→waste) at 0.3; big: 1 h dup + 2 h merged at 2
    assert s["total_usd"] == pytest.approx(2.5 * 0.3 + 3 * 2.0)
    assert s["waste_usd"] == pytest.approx(1.5 * 0.3 + 1 * 2.0)
    assert s["useful_usd"] == pytest.approx(0.3 + 4.0)
    assert s["merged_samples"] == 4000
    assert s["usd_per_merged_sample"] == pytest.approx(6.75 / 4000)
    assert s["on_demand_equivalent_usd"] == pytest.approx(2.5 * 1.0 + 3 * 4.0)
    assert s["on_demand_merged_usd"] == pytest.approx(1.0 + 8.0)
    assert s["realized_savings"] == pytest.approx(1 - 6.75 / 9.0)
    assert s["spot_discount"] == pytest.approx(1 - 6.75 / 14.5)
    assert s["upper_bound_seconds"] == pytest.approx(3600)
    assert set(s["instance_types"]) == {"big", "cheap"}
    assert s["instance_types"]["big"]["total_usd"] == pytest.approx(6.0)
    assert s["instance_types"]["cheap"]["discount"] == pytest.approx(0.7)
    e0, e1 = s["history"]
    assert (e0["epoch"], e0["attempts"], e0["merged"]) == (0, 3, 1)
    assert e0["total_usd"] == pytest.approx(0.3 + 0.15 + 2.0)
    assert e1["waste_usd"] == pytest.approx(0.3)


def test_pending_while_running_is_neither_useful_nor_waste() -> None:
    attempts = [attempt("merged", 3600), attempt("finished", 3600), attempt("running", None)]
    s = summary(attempts, run_ended=False, until=T0 + timedelta(hours=2))
    assert s["waste_usd"] == 0
    assert s["pending_usd"] == pytest.approx(3 * 0.3)
    assert s["pending_seconds"] == pytest.approx(3600 + 7200)
    assert s["realized_savings"] == pytest.approx(0.7)  # pending excluded until decided


def test_empty_run_and_unknown_types() -> None:
    s = summary([])
    assert s["total_usd"] == 0 and s["realized_savings"] is None and s["history"] == []
    assert "cost in" in format_cost({"run": "r", "state": "created", **s})
    with pytest.raises(ConfigError, match="no price for instance type 'gpu9'"):
        summary([attempt()], worker_types={"*": "gpu9"})
    with pytest.raises(ConfigError, match="no price"):
        summary([attempt()], instance_type="nope")


def test_format_cost_shows_every_figure() -> None:
    s = summary([attempt("merged", 3600), attempt("killed", 600, samples=None)])
    text = format_cost({"run": "r1", "state": "completed", "prices_as_of": "test", **s})
    for needle in ("r1", "spot discount 70.0%", "realized savings", "waste", "cheap", "epoch"):
        assert needle in text
    assert isinstance(TABLE, PriceTable)


# -- salvaged checkpoints -----------------------------------------------------------


def _chain(first: str, second: str, last: str) -> list[Attempt]:
    """A killed after 1 h (checkpoint at 0.75 h), B resumed it, C resumed B."""
    a = attempt(first, 3600.0)
    a.train_seconds = 2700.0
    b = attempt(second, 1800.0, start=3600.0)
    b.train_seconds, b.resumed_from = 900.0, a.id
    c = attempt(last, 1200.0, start=5400.0)
    c.resumed_from = b.id
    return [a, b, c]


def test_checkpoints_that_reach_a_merged_result_are_salvaged() -> None:
    a, b, c = _chain("killed", "killed", "merged")
    # Recorded before resumed_seconds: each source's own checkpointed seconds.
    assert salvaged_attempts([a, b, c]) == {a.id: 2700.0, b.id: 900.0}
    assert salvaged_attempts(_chain("killed", "killed", "failed")) == {}
    assert salvaged_attempts([a, c]) == {}  # C resumed an attempt not in the list


def test_a_source_that_lived_on_is_salvaged_only_up_to_the_checkpoint_read() -> None:
    # A worker leaving under a notice went on training after B had resumed
    # its checkpoint at 1000 s, then recorded all 3000 s and ended duplicate.
    a = attempt("duplicate", 3600.0)
    a.train_seconds = 3000.0
    b = attempt("merged", 1800.0, start=1200.0)
    b.train_seconds, b.resumed_from, b.resumed_seconds = 1700.0, a.id, 1000.0
    salvaged = salvaged_attempts([a, b])
    assert salvaged == {a.id: 1000.0}
    assert useful_training_seconds(a, salvaged) == 1000.0
    s = summary([a, b])
    assert s["merged_seconds"] == pytest.approx(1800 + 1000)
    assert s["waste_seconds"] == pytest.approx(3600 - 1000)


def test_salvaged_training_is_useful_and_the_rest_waste() -> None:
    s = summary(_chain("killed", "killed", "merged"))
    # Useful: C's 1200 s + A's 2700 s + B's 900 s kept in checkpoints.
    assert s["merged_seconds"] == pytest.approx(1200 + 2700 + 900)
    assert s["waste_seconds"] == pytest.approx(900 + 900)
    # One merged attempt and its samples; A and B are attempts, not merges.
    assert s["attempts"] == 3 and s["merged"] == 1 and s["merged_samples"] == 100
    # Nothing resumed into a merged result: all of A and B is waste.
    lost = summary(_chain("killed", "killed", "failed"))
    assert lost["merged_seconds"] == 0
    assert lost["waste_seconds"] == pytest.approx(3600 + 1800 + 1200)


@given(kept=st.floats(0, 10_000), wall=st.floats(0, 10_000))
@PROPS
def test_salvage_never_counts_more_than_the_attempt_ran(kept: float, wall: float) -> None:
    a, b, c = _chain("killed", "killed", "merged")
    a.train_seconds = kept
    a.finished_at = a.started_at + timedelta(seconds=wall)
    s = summary([a, b, c])
    total = s["merged_seconds"] + s["waste_seconds"]
    assert total == pytest.approx(wall + 1800 + 1200, abs=1e-6)
    assert s["waste_seconds"] >= 900 - 1e-6


def test_goodput_seconds_of_killed_merged_and_salvaged_attempts() -> None:
    a, b, c = _chain("killed", "killed", "merged")
    c.train_seconds = 1000.0
    salvaged = salvaged_attempts([a, b, c])
    # Killed: the wall time to the recorded end, not the checkpoint's seconds.
    assert training_seconds(a) == 3600.0 and training_seconds(b) == 1800.0
    assert training_seconds(c) == 1000.0  # reported: its training loop
    assert useful_training_seconds(a, salvaged) == 2700.0
    assert useful_training_seconds(b, salvaged) == 900.0
    assert useful_training_seconds(c, salvaged) == 1000.0
    # Not salvaged (nothing merged from it): none of it is useful.
    assert useful_training_seconds(a, {}) == 0.0
    # Never finished, never reported: nothing known.
    running = attempt("running", None)
    assert training_seconds(running) == 0.0


# -- data read from an S3 store --------------------------------------------------------


def test_default_prices_have_dated_s3_read_prices() -> None:
    s3 = default_prices().storage["s3"]
    assert s3.as_of and "aws.amazon.com/s3/pricing" in s3.source
    assert 0 < s3.get_per_1000 < 0.01
    assert s3.transfer_per_gb["same_region"] == 0.0
    assert 0 < s3.transfer_per_gb["cross_region"] < s3.transfer_per_gb["internet"] < 1


def test_a_prices_file_overrides_one_storage_field(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[storage.s3]\ntransfer_internet_per_gb = 0.05\n")
    s3 = load_prices(path).storage["s3"]
    assert s3.transfer_per_gb["internet"] == 0.05
    assert s3.get_per_1000 == default_prices().storage["s3"].get_per_1000
    with pytest.raises(ConfigError, match=r"storage\.s3"):
        parse_prices({"storage": {"s3": {"get_per_1000": -1.0}}}, base=default_prices())
    with pytest.raises(ConfigError, match="missing"):
        parse_prices({"storage": {"gs": {"get_per_1000": 0.1}}})


def test_data_read_from_s3_is_priced_by_requests_and_transfer() -> None:
    s3 = default_prices().storage["s3"]
    a, b = attempt(epoch=0), attempt("killed", epoch=1)
    a.data_bytes, a.data_requests, a.written_bytes = 3 * 2**30, 1500, 10
    b.data_bytes, b.data_requests = 2**30, 500
    summary = cost_summary(
        [a, b], TABLE, until=T0, run_ended=True, instance_type="cheap", storage=s3
    )
    want = 2000 / 1000 * s3.get_per_1000 + 4 * s3.transfer_per_gb["internet"]
    assert summary["data_usd"] == pytest.approx(want)
    assert summary["data_bytes"] == 4 * 2**30 and summary["data_requests"] == 2000
    assert summary["written_bytes"] == 10
    assert [h["data_bytes"] for h in summary["history"]] == [3 * 2**30, 2**30]
    same = cost_summary(
        [a, b],
        TABLE,
        until=T0,
        run_ended=True,
        instance_type="cheap",
        storage=s3,
        data_transfer="same_region",
    )
    assert same["data_usd"] == pytest.approx(2 * s3.get_per_1000)
    # Not part of the instance bill; and a local store is not priced.
    assert same["total_usd"] == summary["total_usd"]
    local = cost_summary([a, b], TABLE, until=T0, run_ended=True, instance_type="cheap")
    assert local["data_usd"] is None and local["data_bytes"] == 4 * 2**30
    assert "store not priced" in format_cost({"run": "r", "state": "completed", **local})
    assert "GETs $0.0004/1000" in format_cost({"run": "r", "state": "completed", **summary})

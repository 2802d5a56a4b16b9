"""Every merge rule on a real ledger and store: 2-epoch runs; DiLoCo survives its driver.

The assimilator-level test is fast: three results merged by one driver, or
by a driver that dies before the third (a fresh process: nothing in
memory), give the same versions bit for bit, and a momentum restarted from
zeros would not. The flow tests are slow: the real train flow on a
LocalCluster for each ``merge.rule``, and a DiLoCo run whose driver is
SIGKILLed mid-run and resumed, after which every merge has fed the momentum.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from benchmarks.cli_proc import log_tail, reap, start_vcdl
from tests.driverwait import wait_for_run
from vcdl import api
from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.head_cache import head_cache
from vcdl.driver.runs import prepare_run
from vcdl.ledger import Ledger
from vcdl.merge.rules import RULES, STEP_KEY
from vcdl.runtime import RunRef
from vcdl.store.paths import rule_state_path, rule_state_prefix
from vcdl.types import StateDict
from vcdl.views.audit import audit_run
from vcdl.worker.attempt import run_attempt

pytestmark = pytest.mark.timeout(600)


def config(name: str, rule: str, epochs: int = 2, **merge: object) -> RunConfig:
    return parse_config(
        {
            "run": {"name": name, "epochs": epochs, "seed": 2},
            "data": {"name": "mnist1d", "samples": 2000, "shards": 4},
            "model": {"factory": "cnn1d", "kwargs": {"width": 16}},
            "train": {"lr": 1e-2, "batch_size": 50},
            "merge": {"rule": rule, "alpha": 0.5, **merge},
            "cluster": {"workers": 2},
        }
    )


def rule_state(ref: RunRef) -> StateDict:
    head = ref.ledger().head(ref.run)
    return ref.store().read_state(rule_state_path(ref.run, head.uri))


def _three_results(tmp_path: Path, rule: str) -> tuple[RunRef, RunConfig, list[str]]:
    # diloco_async's momentum steps at the third result: it reads the state the
    # first two left (a momentum lost would give another head).
    merge = {"momentum_delay": 3} if rule == "diloco_async" else {}
    cfg = config("dl", rule, epochs=1, **merge).with_locations(tmp_path)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 4)
    ids = [
        str(run_attempt(ref, 0, shard, base_version=0, config=cfg).attempt_id)
        for shard in (0, 1, 2)
    ]
    return ref, cfg, ids


@pytest.mark.parametrize("rule", ["diloco", "diloco_async"])
def test_outer_momentum_survives_a_new_driver_bit_for_bit(tmp_path: Path, rule: str) -> None:
    ref, cfg, ids = _three_results(tmp_path / "one-driver", rule)
    cache = head_cache(cfg)
    for attempt_id in ids:
        assert merge_attempt(ref, attempt_id, cfg, cache).kind == "merged"

    ref2, cfg2, ids2 = _three_results(tmp_path / "two-drivers", rule)
    for attempt_id in ids2[:2]:
        assert merge_attempt(ref2, attempt_id, cfg2, head_cache(cfg2)).kind == "merged"
    # The first driver died: a fresh one has nothing in memory.
    assert merge_attempt(ref2, ids2[2], cfg2, head_cache(cfg2)).kind == "merged"

    one, two = (r.store().read_state(r.ledger().head(r.run).uri) for r in (ref, ref2))
    for key in one:
        assert torch.equal(one[key], two[key]), key
    assert int(rule_state(ref2)[STEP_KEY]) == 3
    # Only the head's state is kept in the store.
    assert len(ref2.store().list(rule_state_prefix(ref2.run))) == 1

    # The test can fail: a momentum restarted from zeros gives other weights.
    ref3, cfg3, ids3 = _three_results(tmp_path / "momentum-lost", rule)
    for attempt_id in ids3[:2]:
        merge_attempt(ref3, attempt_id, cfg3, head_cache(cfg3))
    ref3.store().delete(rule_state_path(ref3.run, ref3.ledger().head(ref3.run).uri))
    merge_attempt(ref3, ids3[2], cfg3, head_cache(cfg3))
    lost = ref3.store().read_state(ref3.ledger().head(ref3.run).uri)
    assert any(not torch.equal(one[k], lost[k]) for k in one if one[k].is_floating_point())


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_trains_a_two_epoch_run(prefect_api: None, tmp_path: Path, rule: str) -> None:
    summary = api.train(config(f"rule-{rule}", rule), home=tmp_path)
    assert summary["state"] == "completed" and summary["head_version"] == 8
    assert [h["merged"] for h in summary["history"]] == [4, 4]
    assert summary["test_accuracy"] is not None and summary["test_accuracy"] > 0.15
    ref = api.run_ref(f"rule-{rule}", home=tmp_path)
    assert audit_run(ref, deep=True) == []
    if RULES[rule].keeps_state:
        assert int(rule_state(ref)[STEP_KEY]) == 8


@pytest.mark.slow
@pytest.mark.chaos
def test_delayed_momentum_survives_a_killed_driver(prefect_api_url: str, tmp_path: Path) -> None:
    # diloco_async: its momentum and its count of results within a round are read
    # back by the resuming driver. diloco keeps its state the same way (the same
    # store path and head cache); its fresh-driver test above covers it.
    home = tmp_path / "home"
    cfg_path = tmp_path / "dl.toml"
    cfg_path.write_text(
        '[run]\nname = "dl-kill"\nepochs = 3\nseed = 2\n'
        '[data]\nname = "mnist1d"\nsamples = 2000\nshards = 4\n'
        '[model]\nfactory = "cnn1d"\nkwargs = { width = 16 }\n'
        "[train]\nlr = 1e-2\nbatch_size = 50\nlocal_epochs = 3\n"
        '[merge]\nrule = "diloco_async"\nalpha = 0.5\n'
    )
    driver = start_vcdl(home, "train", str(cfg_path), env={"PREFECT_API_URL": prefect_api_url})
    ledger_url = f"sqlite:///{home / 'ledger.db'}"
    try:
        wait_for_run(
            driver,
            home / "ledger.db",
            "dl-kill",
            lambda run: 5 <= run.head_version < 12,
            timeout=300,
            tail=lambda: log_tail(home, "train"),
            poll=0.2,
        )
        driver.send_signal(signal.SIGKILL)  # mid-run, no cleanup
        driver.wait(30)
    finally:
        reap(driver)
    killed_at = Ledger(ledger_url).get_run("dl-kill").head_version
    assert killed_at < 12, "the driver finished before it was killed"

    summary = api.resume("dl-kill", home=home)
    assert summary["state"] == "completed" and summary["head_version"] == 12
    ref = api.run_ref("dl-kill", home=home)
    # Every one of the 12 merges fed the momentum: the resumed driver read it
    # back instead of starting from zeros (which would count from 0 again).
    assert int(rule_state(ref)[STEP_KEY]) == 12
    assert audit_run(ref, deep=True) == []

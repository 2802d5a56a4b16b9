"""Sharded merges (``merge.mergers``) on a real ledger and store, and in a real run.

The assimilator-level test is fast: the same trained results merged (one
alone, then a fold) by a driver with 2 mergers and one with 1 give the same
versions, checksums and rule state, bit for bit, and the run audits clean.
The slow test trains a 1-epoch run with ``merge.mergers = 2`` through the
real flow and audits it deep. The model (an MLP of 1.7M parameters, 6.6 MB)
is two chunks of the store: the smallest that two mergers share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import vcdl.driver.sharded as sharded
from tests.bitwise import assert_bitwise
from vcdl import api
from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.fold import merge_attempts
from vcdl.driver.head_cache import head_cache
from vcdl.driver.runs import load_version, prepare_run
from vcdl.runtime import RunRef
from vcdl.store.paths import rule_state_path
from vcdl.views.audit import audit_run
from vcdl.worker.attempt import run_attempt

pytestmark = pytest.mark.timeout(300)


def config(name: str, mergers: int, **merge: Any) -> RunConfig:
    return parse_config(
        {
            "run": {"name": name, "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 1200, "shards": 4},
            "model": {"factory": "mlp", "kwargs": {"hidden": [1536, 1024]}},
            "train": {"batch_size": 100},
            "merge": {"alpha": 0.5, "mergers": mergers, **merge},
            "cluster": {"workers": 2},
        }
    )


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many merges went through K mergers (the sharded path, not its fallback)."""
    calls: list[int] = []
    real = sharded._once

    def once(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(sharded, "_once", once)
    return calls


def test_two_mergers_make_the_versions_of_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counting(monkeypatch)
    runs: dict[int, tuple[RunRef, list[Any]]] = {}
    for k in (1, 2):
        cfg = config("sharded", k, rule="diloco", result_precision="int8_delta")
        cfg = cfg.with_locations(tmp_path / f"k{k}")
        ref, _, _ = prepare_run(cfg)
        ref.ledger().ensure_subtasks(ref.run, 0, 4)
        ids = [str(run_attempt(ref, 0, s, base_version=0, config=cfg).attempt_id) for s in range(3)]
        cache = head_cache(cfg)
        outcomes = [
            merge_attempt(ref, ids[0], cfg, cache),
            *merge_attempts(ref, ids[1:], cfg, cache),
        ]
        runs[k] = ref, outcomes
    assert calls == [1, 1]  # the merge and the fold of the K = 2 run
    (one, one_out), (two, two_out) = runs[1], runs[2]
    facts = [[(o.kind, o.version, o.alpha, o.staleness) for o in out] for out in (one_out, two_out)]
    assert facts[0] == facts[1] and [o.version for o in two_out] == [1, 2, 3]
    assert_bitwise(load_version(two)[1], load_version(one)[1])
    head1, head2 = one.ledger().head(one.run), two.ledger().head(two.run)
    assert head1.checksum == head2.checksum
    assert_bitwise(
        two.store().read_state(rule_state_path(two.run, head2.uri)),
        one.store().read_state(rule_state_path(one.run, head1.uri)),
    )
    assert audit_run(two, deep=True) == []


@pytest.mark.slow
def test_a_run_with_two_mergers_audits_clean(
    prefect_api: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counting(monkeypatch)
    summary = api.train(config("sharded-run", 2), home=tmp_path)
    assert summary["state"] == "completed" and summary["head_version"] == 4, summary
    assert len(calls) >= 1  # merged by two mergers (a fold is one call for several)
    ref = api.run_ref("sharded-run", home=tmp_path)
    assert audit_run(ref, deep=True) == []

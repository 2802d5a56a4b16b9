"""The delta rule on a real store and ledger: each result's change from its own base.

Two attempts start from v0 and a third from the head after both merged; with
α 0.5 the first two average (local SGD) whatever their merge order, and the
assimilator finds the stale result's base in its cache or, in a fresh
process, in the store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.head_cache import HeadCache, head_cache
from vcdl.driver.runs import prepare_run
from vcdl.runtime import RunRef
from vcdl.types import StateDict
from vcdl.worker.attempt import run_attempt

pytestmark = pytest.mark.timeout(120)


def make_run(tmp_path: Path) -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": "delta", "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 2000, "shards": 3},
            "model": {"factory": "cnn1d", "kwargs": {"width": 16}},
            "merge": {"rule": "delta", "alpha": 0.5},
        }
    ).with_locations(tmp_path)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 3)
    return ref, cfg


def _state(ref: RunRef, uri: str | None) -> StateDict:
    assert uri is not None
    return ref.store().read_state(uri)


def _version(ref: RunRef, number: int) -> StateDict:
    return _state(ref, ref.ledger().get_version(ref.run, number).uri)


@pytest.mark.parametrize("fresh_cache", [False, True], ids=["cached-base", "base-from-store"])
def test_two_results_from_one_base_average_and_the_next_starts_from_them(
    tmp_path: Path, fresh_cache: bool
) -> None:
    ref, cfg = make_run(tmp_path)
    ledger = ref.ledger()
    v0 = _version(ref, 0)
    first = run_attempt(ref, 0, 0, base_version=0, config=cfg)
    second = run_attempt(ref, 0, 1, base_version=0, config=cfg)
    results = [
        _state(ref, ledger.get_attempt(str(o.attempt_id)).result_uri) for o in (first, second)
    ]

    cache = head_cache(cfg)
    assert cache.keep > 0  # the delta rule keeps recent bases
    out1 = merge_attempt(ref, str(first.attempt_id), cfg, cache=cache)
    # A new merger process has no kept versions: v0 comes from the store.
    out2 = merge_attempt(
        ref, str(second.attempt_id), cfg, cache=HeadCache() if fresh_cache else cache
    )
    assert (out1.kind, out1.version, out1.staleness) == ("merged", 1, 0)
    assert (out2.kind, out2.version, out2.staleness) == ("merged", 2, 1)
    assert "read_base" in out2.timings

    v2 = _version(ref, 2)
    for key, t in v0.items():
        if t.is_floating_point():
            mean = 0.5 * (results[0][key] + results[1][key])
            assert torch.allclose(v2[key], mean, rtol=1e-5, atol=1e-6), key
            assert not torch.allclose(v2[key], t)  # training moved it
        else:
            assert torch.equal(v2[key], torch.maximum(results[0][key], results[1][key]))

    third = run_attempt(ref, 0, 2, config=cfg)
    assert third.base_version == 2
    result = _state(ref, ledger.get_attempt(str(third.attempt_id)).result_uri)
    out3 = merge_attempt(ref, str(third.attempt_id), cfg, cache=cache)
    assert (out3.kind, out3.version, out3.staleness) == ("merged", 3, 0)
    v3 = _version(ref, 3)
    for key, t in v2.items():
        if t.is_floating_point():  # from the head itself: the VC-ASGD blend
            assert torch.allclose(v3[key], 0.5 * (t + result[key]), rtol=1e-5, atol=1e-6), key

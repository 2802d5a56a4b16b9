"""HeadCache: the assimilator's cached head and its recycled output buffers.

The cache lends the tensors of the version before the head to the next
merge (double buffering). These tests pin who may be written to: only
states the cache owns, never the current head, never a state a caller put
without ``owned=True``, never a state returned by ``get`` before two more
versions have been put.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vcdl.config import MergeSection
from vcdl.driver.head_cache import HeadCache
from vcdl.merge import vc_asgd
from vcdl.merge.rules import Applied, merge_rule
from vcdl.types import StateDict


class _Row:
    """The two fields of a ledger Version that the cache reads."""

    def __init__(self, number: int, uri: str) -> None:
        self.number, self.uri = number, uri


def state(value: float) -> StateDict:
    return {"w": torch.full((3, 2), value), "n": torch.tensor(int(value))}


def ptrs(s: StateDict) -> set[int]:
    return {t.data_ptr() for t in s.values()}


VC_ASGD = merge_rule(MergeSection(rule="vc_asgd"))
DELTA = merge_rule(MergeSection(rule="delta"))


def weights(out: Applied | str) -> StateDict:
    assert not isinstance(out, str), out
    return out.weights


def copy(s: StateDict) -> StateDict:
    return {k: t.clone() for k, t in s.items()}


def chain(cache: HeadCache, result: StateDict, steps: int) -> list[StateDict]:
    made = []
    for _ in range(steps):
        assert cache.state is not None and cache.number is not None
        new = weights(cache.merge(VC_ASGD, cache.state, result, 0.5))
        cache.put(cache.number + 1, new, owned=True)
        made.append(new)
    return made


def test_merges_recycle_the_state_before_the_head() -> None:
    cache = HeadCache()
    v0 = state(0.0)
    cache.put(0, v0, owned=True)
    result = state(8.0)
    v1, v2, v3 = chain(cache, result, 3)
    assert ptrs(v1).isdisjoint(ptrs(v0))  # no spare yet: fresh memory
    assert ptrs(v2) == ptrs(v0)  # v0's buffers, v0 being two versions old
    assert ptrs(v3) == ptrs(v1)
    assert torch.equal(v3["w"], torch.full((3, 2), 7.0))  # 0 -> 4 -> 6 -> 7
    assert int(v3["n"]) == 8
    assert torch.equal(result["w"], torch.full((3, 2), 8.0))  # the result is never written


def test_values_match_plain_merges() -> None:
    cache = HeadCache()
    cache.put(0, state(1.0), owned=True)
    result = {"w": torch.randn(3, 2), "n": torch.tensor(5)}
    expected = state(1.0)
    for _ in range(4):  # one step at a time: older versions get recycled
        (new,) = chain(cache, result, 1)
        expected = vc_asgd(expected, result, 0.5)
        torch.testing.assert_close(new["w"], expected["w"], rtol=1e-6, atol=1e-6)
        assert int(new["n"]) == 5


def test_states_put_by_a_caller_are_never_written() -> None:
    cache = HeadCache()
    mine = state(2.0)
    before = copy(mine)
    cache.put(0, mine)  # not owned
    result = state(4.0)
    made = chain(cache, result, 3)
    assert torch.equal(mine["w"], before["w"]) and torch.equal(mine["n"], before["n"])
    assert all(ptrs(m).isdisjoint(ptrs(mine)) for m in made)


def test_a_state_from_get_is_valid_until_two_more_versions() -> None:
    cache = HeadCache()
    loads: list[str] = []

    def load(uri: str) -> StateDict:
        loads.append(uri)
        return state(1.0)

    got = cache.get(_Row(5, "v5"), load)  # type: ignore[arg-type]
    assert cache.get(_Row(5, "v5"), load) is got and loads == ["v5"]  # cached
    snapshot = copy(got)
    chain(cache, state(3.0), 1)
    assert torch.equal(got["w"], snapshot["w"])  # one version later: untouched
    chain(cache, state(3.0), 1)  # two versions later: its buffers hold v7
    assert ptrs(cache.state or {}) == ptrs(got)


def test_a_spare_of_another_shape_is_not_used() -> None:
    cache = HeadCache()
    cache.put(0, {"w": torch.zeros(5), "n": torch.tensor(0)}, owned=True)
    cache.put(1, state(1.0), owned=True)  # the 5-element state becomes the spare
    new = weights(cache.merge(VC_ASGD, state(1.0), state(3.0), 0.5))
    assert new["w"].shape == (3, 2)


def test_a_rejected_result_keeps_the_spare() -> None:
    cache = HeadCache()
    v0 = state(0.0)
    cache.put(0, v0, owned=True)
    chain(cache, state(2.0), 1)
    bad = state(2.0)
    bad["w"][0, 0] = float("nan")
    assert cache.state is not None
    reason = cache.merge(VC_ASGD, cache.state, bad, 0.5)
    assert isinstance(reason, str) and "NaN" in reason
    (v2,) = chain(cache, state(2.0), 1)
    assert ptrs(v2) == ptrs(v0)  # the spare survived the rejection


def test_kept_versions_serve_as_bases_and_are_recycled_after_them() -> None:
    loads: list[str] = []

    def load(uri: str) -> StateDict:
        loads.append(uri)
        return state(-1.0)

    cache = HeadCache(keep=2)
    v0 = state(0.0)
    cache.put(0, v0, owned=True)
    v1, v2, v3 = chain(cache, state(8.0), 3)
    # Head v3; v2 and v1 kept; v0 went to the spare when v3 was put.
    assert cache.base(_Row(3, "v3"), load) is v3  # type: ignore[arg-type]
    assert cache.base(_Row(2, "v2"), load) is v2  # type: ignore[arg-type]
    assert cache.base(_Row(1, "v1"), load) is v1  # type: ignore[arg-type]
    assert loads == []
    assert torch.equal(cache.base(_Row(0, "v0"), load)["w"], torch.full((3, 2), -1.0))  # type: ignore[arg-type]
    assert loads == ["v0"]
    kept = copy(v1)
    (v4,) = chain(cache, state(8.0), 1)
    assert ptrs(v4) == ptrs(v0)  # the spare: never a kept base
    assert all(torch.equal(v1[k], kept[k]) for k in v1)  # v1 is the spare now
    (v5,) = chain(cache, state(8.0), 1)
    assert ptrs(v5) == ptrs(v1)


def test_a_delta_merge_never_writes_into_its_base() -> None:
    cache = HeadCache()
    v0 = state(0.0)
    cache.put(0, v0, owned=True)
    (v1,) = chain(cache, state(8.0), 1)
    result = state(2.0)
    # The spare is v0's memory (keep=0); with v0 as the base it must not be written.
    new = weights(cache.merge(DELTA, v1, result, 0.5, base=v0))
    assert ptrs(new).isdisjoint(ptrs(v0))
    assert torch.equal(v0["w"], torch.zeros(3, 2))
    assert torch.equal(new["w"], torch.full((3, 2), 5.0))  # 4 + 0.5 * (2 - 0)


def test_the_driver_keeps_one_cache_per_run_across_epochs(tmp_path: Path) -> None:
    from vcdl.config import parse_config
    from vcdl.driver.head_cache import forget_run_cache, run_head_cache
    from vcdl.runtime import RunRef

    cfg = parse_config({"run": {"name": "r"}}).with_locations(tmp_path)
    ref = RunRef.from_config(cfg)
    cache = run_head_cache(ref, cfg)
    cache.put(3, state(1.0), owned=True)
    assert run_head_cache(ref, cfg) is cache  # the next epoch finds v3 in memory
    # Another store (or ledger, or run) with the same run name is another run.
    elsewhere = ref.model_copy(update={"store_url": str(tmp_path / "other")})
    assert run_head_cache(elsewhere, cfg) is not cache
    # The delta rule keeps recent bases: a cache without them is replaced.
    delta = cfg.updated(merge={"rule": "delta"})
    assert run_head_cache(ref, delta).keep > 0
    forget_run_cache(ref)
    forget_run_cache(elsewhere)
    assert run_head_cache(ref, cfg) is not cache
    forget_run_cache(ref)

"""Results that wait together, folded into one version write (``merge.fold``).

The fold must be merging one at a time, bit for bit: the same weights, α,
staleness and version numbers, with only the last version stored and the
ones between recorded as never stored. Each test trains the same attempts
in two runs (training is deterministic) and merges them folded in one and
one at a time in the other. A result the fold cannot take (bad, stale)
makes the group merge one at a time: its outcomes are then exactly those
of merging alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.bitwise import assert_bitwise
from vcdl.config import MergeSection, RunConfig, parse_config
from vcdl.driver.assimilator import MergeOutcome, merge_attempt
from vcdl.driver.fold import merge_attempts
from vcdl.driver.head_cache import head_cache
from vcdl.driver.runs import load_version, prepare_run
from vcdl.driver.streamed import Step, Streamed, streamed_fold
from vcdl.errors import VersionPruned
from vcdl.ledger.models import FOLDED_CHECKSUM
from vcdl.merge.rules import RULES, Applied, MergeRule, merge_rule
from vcdl.runtime import RunRef
from vcdl.store import WeightStore
from vcdl.store.streaming import specs_of
from vcdl.types import StateDict
from vcdl.views.audit import audit_run
from vcdl.worker.attempt import run_attempt

pytestmark = pytest.mark.timeout(300)

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


# -- the streamed fold against the in-memory chain ------------------------------------------


def _states(seed: int, dtype: torch.dtype, n: int) -> tuple[StateDict, list[StateDict]]:
    """A head and ``n`` states (results or bases): floats of several shapes, a counter."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(300, 70), (5,), (), (0, 3), (1000,)]

    def state(shift: float) -> StateDict:
        s: StateDict = {
            f"w{i}": (torch.randn(sh, generator=gen) + shift).to(dtype)
            for i, sh in enumerate(shapes)
        }
        s["bn.num_batches_tracked"] = torch.tensor(int(100 + 10 * shift))
        return s

    return state(0.0), [state(0.1 * (i + 1)) for i in range(n)]


@pytest.mark.parametrize("rule_name", sorted(RULES))
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("k", [1, 3])
def test_the_streamed_fold_is_the_chain_of_merges(
    tmp_path: Path, rule_name: str, dtype: torch.dtype, k: int
) -> None:
    rule = merge_rule(MergeSection(rule=rule_name))  # type: ignore[arg-type]
    head, states = _states(k, dtype, 2 * k)
    results, bases = states[:k], states[k:]
    alphas = [0.35 + 0.1 * i for i in range(k)]
    # One at a time in memory: each merge into the previous one's output, the
    # rule's state carried along.
    want, rule_state = head, None
    for result, base, alpha in zip(results, bases, alphas, strict=True):
        applied = rule.apply(want, result, alpha, base=base, state=rule_state)
        assert isinstance(applied, Applied), applied
        want, rule_state = applied.weights, applied.state
    store = WeightStore(str(tmp_path / "store"))
    for i, (result, base) in enumerate(zip(results, bases, strict=True)):
        store.write_state(f"r{i}", result)
        store.write_state(f"b{i}", base)
    out = {n: torch.empty_like(t) for n, t in head.items()} if rule.writes_out else None
    got = streamed_fold(
        rule,
        head,
        [
            # The bases in memory and in the store, both ways.
            Step(
                store.reader(f"r{i}"),
                alphas[i],
                None if not rule.reads_base else (bases[i] if i % 2 else store.reader(f"b{i}")),
            )
            for i in range(k)
        ],
        lambda: store.writer("v", specs_of(head)),
        out=out,
        batch_bytes=20_000,  # many batches; the 300x70 tensor in rows
    )
    assert got.applied is not None, got.reason
    assert_bitwise(got.applied.weights, want)
    if out is not None:  # merged in rows into the buffers given, not into a copy
        assert got.applied.weights["w0"] is out["w0"]
    assert_bitwise(store.read_state("v"), want)
    assert got.checksum == store.checksum("v")
    if rule_state is not None:
        assert got.applied.state is not None
        assert_bitwise({n: got.applied.state[n] for n in rule_state}, rule_state)


def fold_stored(tmp: Path, rule: MergeRule, head: StateDict, results: list[StateDict]) -> Streamed:
    """``results`` written to a store and folded into ``head`` at α 0.5, into version "v"."""
    store = WeightStore(str(tmp / "store"))
    for i, result in enumerate(results):
        store.write_state(f"r{i}", result)
    got = streamed_fold(
        rule,
        head,
        [Step(store.reader(f"r{i}"), 0.5) for i in range(len(results))],
        lambda: store.writer("v", specs_of(head)),
        batch_bytes=20_000,
    )
    if got.applied is None:
        assert not store.exists("v")  # a refused fold leaves nothing written
    return got


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_a_bad_result_stops_the_fold_and_is_named(tmp_path: Path, bad: int) -> None:
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head, results = _states(0, torch.float32, 3)
    results[bad]["w4"][17] = float("nan")
    got = fold_stored(tmp_path, rule, head, results)
    assert got.applied is None and got.failed == bad
    assert "NaN" in (got.reason or "") or "finite" in (got.reason or ""), got.reason


def test_the_norm_bound_holds_for_each_result_of_a_fold(tmp_path: Path) -> None:
    head, results = _states(0, torch.float32, 3)
    # Result 1 is far from what it meets (the output of merging result 0); the
    # others are some 200 away.
    results[1] = {k: t * 100 if t.is_floating_point() else t for k, t in results[1].items()}
    rule = merge_rule(MergeSection(rule="vc_asgd", max_update_norm=1000.0))
    got = fold_stored(tmp_path, rule, head, results)
    assert got.applied is None and got.failed == 1, got.reason
    assert "max_update_norm" in (got.reason or "")


# -- the assimilator: folded against one at a time, on a real store and ledger --------------


def make_run(home: Path, **merge: Any) -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": "fold", "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 2000, "shards": 5},
            "model": {"factory": "cnn1d", "kwargs": {"width": 16}},
            "merge": {"alpha": 0.5, **merge},
        }
    ).with_locations(home)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 5)
    return ref, cfg


def twins(tmp_path: Path, **merge: Any) -> list[tuple[RunRef, RunConfig, list[str]]]:
    """Two runs with the same five results: shard 0 from v0 and merged, then four from v0
    (stale by one when they meet the head) and shard 4 from v1."""
    runs = []
    for name in ("folded", "alone"):
        ref, cfg = make_run(tmp_path / name, **merge)
        ids = [str(run_attempt(ref, 0, s, base_version=0, config=cfg).attempt_id) for s in range(4)]
        runs.append((ref, cfg, ids))
    return runs


def outcome_facts(outcomes: list[MergeOutcome]) -> list[tuple[Any, ...]]:
    return [(o.kind, o.version, o.alpha, o.staleness, o.reason) for o in outcomes]


@pytest.mark.parametrize(
    "merge",
    [
        {"rule": "vc_asgd", "staleness": "raise"},
        {"rule": "delta"},
        {"rule": "diloco"},
        {"rule": "diloco_async"},
        {"rule": "vc_asgd", "result_precision": "int8_delta"},
    ],
    ids=["vc_asgd-raise", "delta", "diloco", "diloco_async", "int8"],
)
def test_a_fold_is_merging_one_at_a_time_with_one_version_written(
    tmp_path: Path, merge: dict[str, Any]
) -> None:
    (f_ref, f_cfg, f_ids), (a_ref, a_cfg, a_ids) = twins(tmp_path, **merge)
    f_cache, a_cache = head_cache(f_cfg), head_cache(a_cfg)
    # A first merge alone in both: the fold then meets a head that is not v0,
    # and (diloco) a momentum.
    assert merge_attempt(f_ref, f_ids[0], f_cfg, f_cache).version == 1
    assert merge_attempt(a_ref, a_ids[0], a_cfg, a_cache).version == 1

    folded = merge_attempts(f_ref, f_ids[1:], f_cfg, f_cache)
    alone = [merge_attempt(a_ref, a, a_cfg, a_cache) for a in a_ids[1:]]
    assert outcome_facts(folded) == outcome_facts(alone)
    assert [o.version for o in folded] == [2, 3, 4]
    assert [o.staleness for o in folded] == [1, 2, 3]

    f_ledger, a_ledger = f_ref.ledger(), a_ref.ledger()
    assert f_ledger.head(f_ref.run).number == a_ledger.head(a_ref.run).number == 4
    assert_bitwise(load_version(f_ref)[1], load_version(a_ref)[1])
    # Versions 2 and 3 were never stored; the ledger says so, and so do exports.
    for number in (2, 3):
        row = f_ledger.get_version(f_ref.run, number)
        assert row.checksum == FOLDED_CHECKSUM and row.pruned_at is not None
        assert not f_ref.store().exists(row.uri)
        with pytest.raises(VersionPruned, match="folded into a later version"):
            load_version(f_ref, number)
    assert f_ref.store().reader(f_ledger.head(f_ref.run).uri).attrs["folded"] == f_ids[1:3]
    for aid in f_ids:
        uri = f_ledger.get_attempt(aid).result_uri
        assert uri is not None and not f_ref.store().exists(uri)
    assert audit_run(f_ref, deep=True) == []

    # The next attempt starts from the folded head; merged alone in both, still equal.
    nxt = [
        str(run_attempt(r, 0, 4, config=c).attempt_id) for r, c in ((f_ref, f_cfg), (a_ref, a_cfg))
    ]
    assert merge_attempt(f_ref, nxt[0], f_cfg, f_cache).version == 5
    assert merge_attempt(a_ref, nxt[1], a_cfg, a_cache).version == 5
    assert_bitwise(load_version(f_ref)[1], load_version(a_ref)[1])
    assert audit_run(f_ref, deep=True) == []


def test_a_bad_result_in_a_fold_makes_the_group_merge_one_at_a_time(tmp_path: Path) -> None:
    (f_ref, f_cfg, f_ids), (a_ref, a_cfg, a_ids) = twins(tmp_path)
    for ref, ids in ((f_ref, f_ids), (a_ref, a_ids)):
        # The third result's bytes turn to NaN where a dying machine wrote garbage.
        uri = ref.ledger().get_attempt(ids[2]).result_uri
        assert uri is not None
        store = ref.store()
        reader = store.reader(uri)
        state, attrs = store.read_state(uri), dict(reader.attrs)
        first = next(k for k, t in state.items() if t.is_floating_point())
        state[first].view(-1)[0] = float("nan")
        store.delete(uri)
        store.write_state(uri, state, attrs=attrs)
    f_cache, a_cache = head_cache(f_cfg), head_cache(a_cfg)
    folded = merge_attempts(f_ref, f_ids, f_cfg, f_cache)
    alone = [merge_attempt(a_ref, a, a_cfg, a_cache) for a in a_ids]
    assert outcome_facts(folded) == outcome_facts(alone)
    assert [o.kind for o in folded] == ["merged", "merged", "rejected", "merged"]
    assert_bitwise(load_version(f_ref)[1], load_version(a_ref)[1])
    # Nothing of the refused fold is left: every version is stored.
    assert all(v.checksum != FOLDED_CHECKSUM for v in f_ref.ledger().versions(f_ref.run))
    assert audit_run(f_ref, deep=True) == []


def test_a_stale_result_makes_the_group_merge_one_at_a_time(tmp_path: Path) -> None:
    # max_staleness 1: the third of three results from v0 is too stale.
    (f_ref, f_cfg, f_ids), (a_ref, a_cfg, a_ids) = twins(
        tmp_path, staleness="reject", max_staleness=1
    )
    folded = merge_attempts(f_ref, f_ids[:3], f_cfg, head_cache(f_cfg))
    a_cache = head_cache(a_cfg)
    alone = [merge_attempt(a_ref, a, a_cfg, a_cache) for a in a_ids[:3]]
    assert outcome_facts(folded) == outcome_facts(alone)
    assert [o.kind for o in folded] == ["merged", "merged", "rejected"]
    assert_bitwise(load_version(f_ref)[1], load_version(a_ref)[1])

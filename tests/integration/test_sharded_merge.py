"""K merger processes (``merge.mergers``) write the bytes one merger writes, bit for bit.

The merge functions are driven directly on small states in a temporary
store, its chunks made small (8 KiB) so that a few kilobytes of tensors
span many chunks and K ranges: every rule, every float dtype, every result
precision, K = 2 and 3, against K = 1 (the weights, the rule's state, the
version's checksum and every file of its group). Also: a fold across K
mergers; a merger SIGKILLed mid-merge (the merge redone, nothing left of
the try, the head as K = 1 makes it); bad results rejected with nothing
left behind.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import vcdl.driver.merger as merger
import vcdl.driver.sharded as sharded
from tests.bitwise import assert_bitwise
from vcdl.config import MergeSection
from vcdl.driver.streamed import Decoded, Step, Streamed, streamed_fold
from vcdl.merge.codec import encode
from vcdl.merge.rules import RULES, Applied, MergeRule, merge_rule
from vcdl.store import WeightStore, layout
from vcdl.store.streaming import TensorSource, specs_of
from vcdl.types import StateDict

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHAPES = [(300, 70), (5,), (), (0, 3), (1000,), (40, 40, 3), (3000,), (7, 1)]
BATCH = 20_000  # many batches, and the larger tensors in rows


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "CHUNK_BYTES", 8 << 10)


def states(seed: int, dtype: torch.dtype) -> tuple[StateDict, StateDict, StateDict]:
    """Head, a result trained from the base, the base: floats, a counter, a mask."""
    gen = torch.Generator().manual_seed(seed)

    def state(shift: float) -> StateDict:
        s: StateDict = {
            f"w{i}": (torch.randn(shape, generator=gen) + shift).to(dtype)
            for i, shape in enumerate(SHAPES)
        }
        s["bn.num_batches_tracked"] = torch.tensor(int(100 + 10 * shift))
        s["mask"] = torch.rand(7, generator=gen) > 0.5
        return s

    return state(0.0), state(0.3), state(0.1)


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def merge(
    store: WeightStore,
    rule: MergeRule,
    head: StateDict,
    steps: list[Step],
    path: str,
    k: int,
    state: StateDict | None = None,
) -> Streamed:
    return streamed_fold(
        rule,
        head,
        steps,
        lambda: store.writer(path, specs_of(head), {"n": 1}),
        state=state,
        out={n: torch.empty_like(t) for n, t in head.items()} if rule.writes_out else None,
        batch_bytes=BATCH,
        mergers=k,
    )


def assert_same(store: WeightStore, root: Path, want: Streamed, got: Streamed, k: int) -> None:
    assert want.applied is not None, want.reason
    assert got.applied is not None, got.reason
    assert_bitwise(got.applied.weights, want.applied.weights)
    assert got.checksum == want.checksum
    if want.applied.state is not None:
        assert got.applied.state is not None
        assert_bitwise(got.applied.state, want.applied.state)
    else:
        assert got.applied.state is None
    assert files(root / f"v{k}") == files(root / "v1")
    assert store.checksum(f"v{k}") == want.checksum


def sources(
    store: WeightStore, precision: str, base: StateDict, rule: MergeRule, name: str
) -> Step:
    base_src = store.reader(f"base-{name}")
    result: TensorSource = store.reader(name)
    if precision != "full":
        result = Decoded(store.reader(name), base_src, precision)  # type: ignore[arg-type]
    return Step(result, 0.35, base_src if rule.reads_base else None)


@pytest.mark.parametrize("precision", ["full", "bf16_delta", "int8_delta"])
@pytest.mark.parametrize("rule_name", sorted(RULES))
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).removeprefix("torch."))
def test_k_mergers_write_the_bytes_of_one(
    tmp_path: Path, rule_name: str, dtype: torch.dtype, precision: str
) -> None:
    # K = 2 and 3 cut w0 (2-D, in rows) between mergers.
    merge_with(tmp_path, rule_name, dtype, precision, (2, 3))


@pytest.mark.parametrize("precision", ["full", "int8_delta"])
@pytest.mark.parametrize("rule_name", sorted(RULES))
def test_seven_mergers_cut_vectors_and_3d_tensors_too(
    tmp_path: Path, rule_name: str, precision: str
) -> None:
    # K = 7 also cuts w4 (a vector, merged whole by both neighbours) and w5 (40x40x3).
    merge_with(tmp_path, rule_name, torch.bfloat16, precision, (7,))


def merge_with(
    tmp_path: Path, rule_name: str, dtype: torch.dtype, precision: str, ks: tuple[int, ...]
) -> None:
    rule = merge_rule(MergeSection(rule=rule_name))  # type: ignore[arg-type]
    head, result, base = states(1, dtype)
    state = None
    if rule.keeps_state:  # a momentum from an earlier merge
        first = rule.apply(head, result, 0.4, base=base)
        assert isinstance(first, Applied) and first.state is not None
        state = first.state
    store = WeightStore(str(tmp_path))
    store.write_state("r", encode(result, base, precision))  # type: ignore[arg-type]
    store.write_state("base-r", base)
    runs = {}
    for k in (1, *ks):
        step = sources(store, precision, base, rule, "r")
        runs[k] = merge(store, rule, head, [step], f"v{k}", k, state)
    for k in ks:
        assert_same(store, tmp_path, runs[1], runs[k], k)


@pytest.mark.parametrize("rule_name", ["vc_asgd", "delta", "diloco_async"])
def test_a_fold_across_k_mergers_is_the_fold_of_one(tmp_path: Path, rule_name: str) -> None:
    rule = merge_rule(MergeSection(rule=rule_name), workers=2)  # type: ignore[arg-type]
    head, _, base = states(2, torch.float32)
    store = WeightStore(str(tmp_path))
    store.write_state("base-r0", base)
    for i in range(3):
        _, result, _ = states(10 + i, torch.float32)
        store.write_state(f"r{i}", result)
        store.write_state(f"base-r{i}", base)
    runs = {}
    for k in (1, 2):
        steps = [sources(store, "full", base, rule, f"r{i}") for i in range(3)]
        steps = [Step(s.result, 0.2 + 0.1 * i, s.base) for i, s in enumerate(steps)]
        runs[k] = merge(store, rule, head, steps, f"v{k}", k)
    assert_same(store, tmp_path, runs[1], runs[2], 2)


def kill_once(
    marker: Path, merger: int, batch: int, sig: int = signal.SIGKILL
) -> Callable[[int, int], None]:
    """A hook that sends ``sig`` to merger ``merger`` at its batch ``batch``, in the first
    try only."""

    def hook(index: int, at: int) -> None:
        if index == merger and at == batch and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), sig)

    return hook


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_merger_killed_mid_merge_is_redone_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int
) -> None:
    rule = merge_rule(MergeSection(rule="diloco"))
    head, result, base = states(3, torch.float32)
    store = WeightStore(str(tmp_path / "s"))
    store.write_state("r", result)
    store.write_state("base-r", base)
    want = merge(store, rule, head, [sources(store, "full", base, rule, "r")], "v1", 1)
    monkeypatch.setattr(merger, "BEFORE_BATCH", kill_once(tmp_path / "killed", 1, 2, sig))
    got = merge(store, rule, head, [sources(store, "full", base, rule, "r")], "v2", 2)
    assert (tmp_path / "killed").exists()  # it was killed, and the merge redone
    assert_same(store, tmp_path / "s", want, got, 2)
    assert sorted(store.list("")) == ["base-r", "r", "v1", "v2"]


def test_a_merger_killed_in_every_try_fails_the_merge_with_nothing_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head, result, _ = states(4, torch.float32)
    store = WeightStore(str(tmp_path))
    store.write_state("r", result)

    def always(index: int, at: int) -> None:
        if index == 0 and at == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(merger, "BEFORE_BATCH", always)
    with pytest.raises(sharded.MergerDied):
        merge(store, rule, head, [Step(store.reader("r"), 0.5)], "v2", 2)
    assert store.list("") == ["r"]


def test_a_bad_result_is_rejected_by_k_mergers_with_nothing_left(tmp_path: Path) -> None:
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head, result, _ = states(5, torch.float32)
    result["w6"][2999] = float("nan")  # in the last range
    store = WeightStore(str(tmp_path))
    store.write_state("r", result)
    got = merge(store, rule, head, [Step(store.reader("r"), 0.5)], "v2", 3)
    assert got.applied is None and "NaN" in (got.reason or "") and got.failed == 0
    assert store.list("") == ["r"]


@pytest.mark.parametrize(
    ("chunk", "at", "k"),
    # w0 (2-D): no merger reads all of it, the driver verifies it whole. w4 (a
    # vector, across a boundary at K = 7): each merger reads it whole, verified.
    [("c.3", 100, 3), ("c.11", 128, 7)],
    ids=["rows-by-the-driver", "vector-by-each-merger"],
)
def test_a_corrupt_tensor_crossing_a_boundary_is_found(
    tmp_path: Path, chunk: str, at: int, k: int
) -> None:
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head, result, _ = states(6, torch.float32)
    store = WeightStore(str(tmp_path))
    store.write_state("r", result)
    path = tmp_path / "r" / "float32" / chunk
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    got = merge(store, rule, head, [Step(store.reader("r"), 0.5)], "v2", k)
    assert got.applied is None and "unreadable" in (got.reason or ""), got.reason
    assert store.list("") == ["r"]


def test_without_enough_chunks_one_merger_does_it_all(tmp_path: Path) -> None:
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head = {"w": torch.ones(10)}
    store = WeightStore(str(tmp_path))
    store.write_state("r", {"w": torch.zeros(10)})
    got = merge(store, rule, head, [Step(store.reader("r"), 0.5)], "v2", 4)
    assert got.applied is not None and torch.equal(got.applied.weights["w"], torch.full((10,), 0.5))


def test_without_room_in_shared_memory_one_merger_does_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A container's 64 MB /dev/shm: the same merge by one merger, said once."""
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    head, result, _ = states(7, torch.float32)
    store = WeightStore(str(tmp_path))
    store.write_state("r", result)
    want = merge(store, rule, head, [Step(store.reader("r"), 0.5)], "v1", 1)

    class Full:
        f_bavail, f_frsize = 0, 4096

    monkeypatch.setattr(sharded.os, "statvfs", lambda _: Full())
    monkeypatch.setattr(sharded, "_WARNED", False)

    def no_fork() -> int:
        raise AssertionError("forked a merger without room for it")

    monkeypatch.setattr(sharded.os, "fork", no_fork)
    got = merge(store, rule, head, [Step(store.reader("r"), 0.5)], "v2", 2)
    assert "/dev/shm has 0 MB free" in caplog.text
    assert got.checksum == want.checksum


def test_k_mergers_on_s3_write_the_bytes_of_one(s3_bucket_url: tuple[str, Any]) -> None:
    """A merger opens the store afresh after the fork (the parent's S3 client is bound to
    the parent's I/O loop): on a real S3 endpoint (moto), the bytes of one merger."""
    url, options = s3_bucket_url
    rule = merge_rule(MergeSection(rule="delta"))
    head, result, base = states(8, torch.bfloat16)
    store = WeightStore(url, options)
    store.write_state("r", encode(result, base, "int8_delta"))
    store.write_state("base-r", base)
    runs = {k: merge(store, rule, head, [sources(store, "int8_delta", base, rule, "r")], f"v{k}", k)
            for k in (1, 2)}  # fmt: skip
    assert runs[2].applied is not None and runs[1].applied is not None
    assert_bitwise(runs[2].applied.weights, runs[1].applied.weights)
    assert runs[2].checksum == runs[1].checksum == store.checksum("v2")
    assert_bitwise(store.read_state("v2"), store.read_state("v1"))

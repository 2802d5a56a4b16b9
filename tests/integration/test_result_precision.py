"""merge.result_precision end to end: a worker stores its change in fewer bytes, the driver
adds it back to the base version and merges; the head lands where a full-precision result
would have put it, within the encoding's error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.test_failure_modes import make_run
from vcdl.driver.assimilator import merge_attempt
from vcdl.merge.codec import SCALE_SUFFIX
from vcdl.runtime import RunRef
from vcdl.types import StateDict
from vcdl.worker.attempt import run_attempt


def _merged(tmp: Path, precision: str) -> tuple[RunRef, StateDict, int]:
    ref, cfg = make_run(tmp, result_precision=precision)
    out = run_attempt(ref, 0, 0, config=cfg)
    attempt = ref.ledger().get_attempt(str(out.attempt_id))
    assert attempt.result_uri is not None
    reader = ref.store().reader(attempt.result_uri)
    assert reader.attrs["encoding"] == precision
    nbytes = sum(s.nbytes for s in reader.specs)
    dtypes = {s.dtype for s in reader.specs if not s.name.endswith(SCALE_SUFFIX)}
    if precision == "bf16_delta":
        assert torch.bfloat16 in dtypes and torch.float32 not in dtypes
    if precision == "int8_delta":
        assert torch.int8 in dtypes and torch.float32 not in dtypes
    merged = merge_attempt(ref, str(out.attempt_id), cfg)
    assert merged.kind == "merged", merged.reason
    head = ref.ledger().head(ref.run)
    return ref, ref.store().read_state(head.uri), nbytes


@pytest.mark.parametrize(("precision", "ratio"), [("bf16_delta", 1.99), ("int8_delta", 3.0)])
def test_a_reduced_result_merges_close_to_the_full_one(
    tmp_path: Path, precision: str, ratio: float
) -> None:
    ref_full, full, full_bytes = _merged(tmp_path / "full", "full")
    _, reduced, red_bytes = _merged(tmp_path / precision, precision)
    # A tiny model: per-row scales weigh more than in a large one (4x there).
    assert full_bytes / red_bytes >= ratio
    # Same seed, same shard, same base: the attempts trained the same weights;
    # only the encoding of their change differs.
    v0 = ref_full.store().read_state(ref_full.ledger().get_version(ref_full.run, 0).uri)
    for k, w in full.items():
        if not w.is_floating_point():
            assert torch.equal(reduced[k], w), k
            continue
        moved = (w - v0[k]).abs().max().item()
        tol = moved * (2.0**-8 if precision == "bf16_delta" else 1 / 127) + 1e-6
        assert (reduced[k] - w).abs().max().item() <= tol, k


def test_a_result_claiming_an_encoding_it_does_not_hold_is_rejected(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path, result_precision="bf16_delta")
    out = run_attempt(ref, 0, 0, config=cfg)
    attempt = ref.ledger().get_attempt(str(out.attempt_id))
    assert attempt.result_uri is not None
    store = ref.store()
    # A worker that says int8 but stored bf16 (a bug, or a forged result).
    state = store.read_state(attempt.result_uri)
    attrs = {**store.read_attrs(attempt.result_uri), "encoding": "int8_delta"}
    store.write_state(attempt.result_uri, state, attrs=attrs)
    merged = merge_attempt(ref, str(out.attempt_id), cfg)
    assert merged.kind == "rejected" and "not a int8_delta encoding" in (merged.reason or "")
    attrs["encoding"] = "zstd"
    store.write_state(attempt.result_uri, state, attrs=attrs)
    ref2, cfg2 = ref, cfg
    out2 = run_attempt(ref2, 0, 1, config=cfg2)
    a2 = ref2.ledger().get_attempt(str(out2.attempt_id))
    assert a2.result_uri is not None
    store.write_state(a2.result_uri, store.read_state(a2.result_uri), attrs=attrs)
    merged2 = merge_attempt(ref2, str(out2.attempt_id), cfg2)
    assert merged2.kind == "rejected" and "unknown encoding 'zstd'" in (merged2.reason or "")

"""Fuzz: mutated result groups through the assimilator's check path never raise out.

One real result (SQLite ledger, local Zarr store); hypothesis rewrites its
group document (records, array metadata, attrs), its chunk files and the
worker's report, and the assimilator opens, checks and merges it: the
outcome is a reason to reject it or a merge, never an exception (docs/design.md
§7: one result never fails a run). Kept to ~10-20 s.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcdl.config import parse_config
from vcdl.driver.assimilator import open_result
from vcdl.driver.head_cache import head_cache
from vcdl.driver.runs import prepare_run
from vcdl.driver.streamed import streamed_check, streamed_merge
from vcdl.merge.rules import rule_of
from vcdl.store.streaming import specs_of
from vcdl.worker.attempt import run_attempt

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 2**31, 2**62, 2**64, 10**15])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["float32", "int64", "bfloat16", "float64", "int8", "bool", "c.0"])
    | st.sampled_from(["full", "bf16_delta", "int8_delta"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
RECORD_FIELDS = ["dtype", "shape", "offset", "array", "checksum"]
ARRAY_FIELDS = ["shape", "data_type", "chunk_grid", "codecs", "chunk_key_encoding"]


@st.composite
def mutations(draw: st.DrawFn, names: list[str], arrays: list[str]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    # Zero mutations too: the pristine result must merge, and without it a
    # sitting of 200 examples could draw no harmless mutation at all (the
    # "both sides exercised" check below then failed by chance).
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(
            st.sampled_from(["record", "array", "attr", "table", "copy", "drop", "chunk", "report"])
        )
        if kind == "record":
            out.append(
                (
                    kind,
                    draw(st.sampled_from(names)),
                    draw(st.sampled_from(RECORD_FIELDS)),
                    draw(VALUES),
                )
            )
        elif kind == "array":
            out.append(
                (
                    kind,
                    draw(st.sampled_from(arrays)),
                    draw(st.sampled_from(ARRAY_FIELDS)),
                    draw(VALUES),
                )
            )
        elif kind == "attr":
            key = draw(st.sampled_from(["encoding", "planned_samples", "samples"]))
            out.append((kind, key, draw(VALUES)))
        elif kind == "table":
            where = draw(st.sampled_from(["tensors", "attrs", "format", "complete", "meta"]))
            out.append((kind, where, draw(VALUES)))
        elif kind == "copy":
            out.append((kind, draw(st.sampled_from(names)), draw(st.integers(-5, 10**6))))
        elif kind == "drop":
            out.append((kind, draw(st.sampled_from(names))))
        elif kind == "chunk":
            out.append((kind, draw(st.sampled_from(["truncate", "extend", "flip", "delete"]))))
        else:
            field = draw(st.sampled_from(["samples", "loss", "train_seconds"]))
            out.append((kind, field, draw(VALUES)))
    return out


def mutate(doc: dict[str, Any], group: Path, attempt: Any, steps: list[tuple[Any, ...]]) -> None:
    vcdl = doc["attributes"]["vcdl"]
    meta = doc["consolidated_metadata"]["metadata"]
    for step in steps:
        kind = step[0]
        records = vcdl.get("tensors")
        if (
            kind == "record"
            and isinstance(records, dict)
            and isinstance(records.get(step[1]), dict)
        ):
            records[step[1]][step[2]] = step[3]
        elif kind == "array" and isinstance(meta.get(step[1]), dict):
            meta[step[1]][step[2]] = step[3]
        elif kind == "attr" and isinstance(vcdl.get("attrs"), dict):
            vcdl["attrs"][step[1]] = step[2]
        elif kind == "table":
            if step[1] == "meta":
                doc["consolidated_metadata"] = step[2]
                meta = {}
            else:
                vcdl[step[1]] = step[2]
        elif (
            kind == "copy" and isinstance(records, dict) and isinstance(records.get(step[1]), dict)
        ):
            records[f"{step[1]}.copy"] = {**records[step[1]], "offset": step[2]}
        elif kind == "drop" and isinstance(records, dict):
            records.pop(step[1], None)
        elif kind == "chunk":
            chunks = [p for p in group.rglob("c.*") if p.is_file()]
            if not chunks:
                continue
            chunk = max(chunks, key=lambda p: p.stat().st_size)
            data = chunk.read_bytes()
            if step[1] == "truncate":
                chunk.write_bytes(data[: len(data) // 2])
            elif step[1] == "extend":
                chunk.write_bytes(data + b"\0" * 64)
            elif step[1] == "flip":
                chunk.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
            else:
                chunk.unlink()
        elif kind == "report":
            setattr(attempt, step[1], step[2])


@pytest.fixture(scope="module", params=["full", "int8_delta"])
def setting(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("fuzz")
    cfg = parse_config(
        {
            "run": {"name": "fuzz", "epochs": 1, "seed": 3},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 4},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "train": {"batch_size": 50},
            "merge": {"max_update_norm": 1e6, "result_precision": request.param},
        }
    ).with_locations(home)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 4)
    out = run_attempt(ref, 0, 0, config=cfg)
    ledger, store = ref.ledger(), ref.store()
    attempt = ledger.get_attempt(str(out.attempt_id))
    assert attempt.result_uri is not None
    group = Path(store.uri(attempt.result_uri))
    pristine = home / "pristine"
    shutil.copytree(group, pristine)
    doc = json.loads((group / "zarr.json").read_bytes())
    names = list(doc["attributes"]["vcdl"]["tensors"])
    arrays = list(doc["consolidated_metadata"]["metadata"])
    head_row = ledger.head(ref.run)
    return {
        "ref": ref,
        "cfg": cfg,
        "attempt_id": attempt.id,
        "group": group,
        "pristine": pristine,
        "names": names,
        "arrays": arrays,
        "head": store.read_state(head_row.uri),
    }


def test_mutated_results_never_raise_out_of_the_check_path(setting: dict[str, Any]) -> None:
    ref, cfg = setting["ref"], setting["cfg"]
    rule = rule_of(cfg)
    head = setting["head"]
    group: Path = setting["group"]
    seen = {"rejected": 0, "ok": 0}

    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        shutil.rmtree(group)
        shutil.copytree(setting["pristine"], group)
        attempt = ref.ledger().get_attempt(setting["attempt_id"])
        steps = data.draw(mutations(setting["names"], setting["arrays"]))
        doc = json.loads((group / "zarr.json").read_bytes())
        mutate(doc, group, attempt, steps)
        (group / "zarr.json").write_text(json.dumps(doc))

        opened = open_result(ref, attempt, cfg, head_cache(cfg))
        if isinstance(opened, str):
            assert opened and "\n" not in opened
            seen["rejected"] += 1
            return
        result, base, _ = opened
        reason = streamed_check(rule, head, result)
        merged = streamed_merge(
            rule,
            head,
            result,
            0.5,
            lambda: ref.store().writer("scratch/fuzz", specs_of(head), {}),
            base=base if rule.reads_base else None,
        )
        if reason is None and merged.reason is None:
            assert merged.applied is not None
            assert all(
                math.isfinite(float(t.float().sum())) for t in merged.applied.weights.values()
            )
            seen["ok"] += 1
        else:
            seen["rejected"] += 1

    check()
    # Both sides were exercised: harmless mutations merge, bad ones are rejected.
    assert seen["rejected"] > 0 and seen["ok"] > 0

"""The pure checks of what a result or a group claims, before anything is allocated.

``check_records`` (a group's record table against its arrays), ``check_identity``
(a group against the ledger's checksum), and the checks of what a worker
reports with its result (``count_problem``, ``metric_problem``, ``report_problem``).
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
import torch

from vcdl.driver.assimilator import report_problem
from vcdl.errors import ChecksumMismatch, IntegrityError
from vcdl.ledger import Attempt
from vcdl.merge.checks import count_problem, metric_problem
from vcdl.store.layout import (
    check_identity,
    check_records,
    combined_checksum,
    plan_read,
    plan_write,
)

URI = "mem://group"


def group_doc(state: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    state = state or {
        "a": torch.zeros(3, 4),
        "b": torch.ones(5),
        "n": torch.tensor(7, dtype=torch.int64),
        "c": torch.zeros(0, 2),
    }
    plan = plan_write(state, URI)
    sums = [f"{i:064x}" for i in range(len(plan.tensors))]
    doc: dict[str, Any] = json.loads(plan.group_doc(sums, {}))
    return doc


def parts(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return doc["attributes"]["vcdl"]["tensors"], doc["consolidated_metadata"]["metadata"]


def test_a_table_vcdl_wrote_passes() -> None:
    records, meta = parts(group_doc())
    table = check_records(records, meta, URI)
    assert list(table.records) == ["a", "b", "n", "c"]
    assert table.records["a"].shape == (3, 4) and table.records["b"].offset == 12
    assert table.nbytes == 17 * 4 + 8
    plan = plan_read(group_doc()["attributes"]["vcdl"], meta, URI, only=["b"])
    assert [t.name for t in plan.tensors] == ["b"]


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("shape", [10**12], "does not fit"),
        ("shape", [2**40, 2**40], "absurd shape"),
        ("shape", [-1], "bad shape"),
        ("shape", [True], "bad shape"),
        ("shape", "3", "bad shape"),
        ("shape", [1.5], "bad shape"),
        ("shape", [1] * 40, "bad shape"),
        ("offset", -1, "bad shape or offset"),
        ("offset", 10**30, "bad shape or offset"),
        ("offset", None, "bad shape or offset"),
        ("offset", 10, "overlap"),
        ("offset", 20, "does not fit"),
        ("dtype", "float64", "does not fit"),
        ("dtype", "no_such", "unknown dtype"),
        ("dtype", ["float32"], "unknown dtype"),
        ("array", "../x", "bad array"),
        ("array", "int64", "does not fit"),
        ("array", "nope", "no array metadata"),
        ("checksum", 5, "no checksum"),
    ],
)
def test_a_bad_record_is_refused(field: str, value: object, words: str) -> None:
    records, meta = parts(group_doc())
    records["b"][field] = value
    with pytest.raises(IntegrityError, match=words):
        check_records(records, meta, URI)


def test_overlapping_records_are_refused() -> None:
    records, meta = parts(group_doc())
    records["b"]["offset"] = 10  # a's bytes are 0..12
    with pytest.raises(IntegrityError, match="overlap"):
        check_records(records, meta, URI)


def test_many_records_on_the_same_bytes_are_refused_before_allocating() -> None:
    # A small array described by many tensors: each fits, together they would
    # allocate far more than the group holds.
    records, meta = parts(group_doc())
    for i in range(1000):
        records[f"copy{i}"] = dict(records["a"])
    with pytest.raises(IntegrityError, match="overlap"):
        check_records(records, meta, URI)


def test_records_that_do_not_fill_their_array_are_refused() -> None:
    records, meta = parts(group_doc())
    del records["b"]
    with pytest.raises(IntegrityError, match="does not describe the array"):
        check_records(records, meta, URI)
    records, meta = parts(group_doc())
    meta["float32"]["shape"] = [10**9]
    with pytest.raises(IntegrityError, match=r"not in vcdl's layout|does not describe"):
        check_records(records, meta, URI)


def test_an_array_of_absurd_size_or_chunking_is_refused() -> None:
    state = {"w": torch.zeros(2)}
    records, meta = parts(group_doc(state))
    n = 10**11
    records["w"]["shape"] = [n]
    meta["float32"]["shape"] = [n]
    meta["float32"]["chunk_grid"]["configuration"]["chunk_shape"] = [n]
    with pytest.raises(IntegrityError, match="more than this machine's memory"):
        check_records(records, meta, URI)
    # Tiny chunks: one plan entry per chunk of an absurd count.
    meta["float32"]["chunk_grid"]["configuration"]["chunk_shape"] = [1]
    with pytest.raises(IntegrityError, match="not in vcdl's layout"):
        check_records(records, meta, URI)
    # Within a stated memory, the same table is fine.
    meta["float32"]["chunk_grid"]["configuration"]["chunk_shape"] = [n]
    assert check_records(records, meta, URI, memory=10**13).nbytes == 4 * n


@pytest.mark.parametrize("records", [None, [], "x", {"a": 3}, {"": {}}])
def test_a_malformed_table_is_refused(records: object) -> None:
    _, meta = parts(group_doc())
    with pytest.raises(IntegrityError):
        check_records(records, meta, URI)


def test_identity_against_the_ledger() -> None:
    vcdl = group_doc()["attributes"]["vcdl"]
    recorded = combined_checksum(vcdl["tensors"])
    check_identity(vcdl, recorded, URI)
    rewritten = copy.deepcopy(vcdl)
    rewritten["tensors"]["b"]["checksum"] = "f" * 64
    with pytest.raises(ChecksumMismatch, match="rewritten") as info:
        check_identity(rewritten, recorded, URI)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    with pytest.raises(IntegrityError):
        check_identity({"tensors": {"b": 1}}, recorded, URI)


@pytest.mark.parametrize(
    ("value", "limit", "problem"),
    [
        (10, 100, None),
        (100, 100, None),
        (5, None, None),
        (0, 100, "not positive"),
        (-5, 100, "not positive"),
        (101, 100, "exceeds"),
        (1.5, 100, "not an integer"),
        (math.inf, 100, "not an integer"),
        (math.nan, 100, "not an integer"),
        (True, 100, "not an integer"),
        (None, 100, "not an integer"),
        ("10", 100, "not an integer"),
    ],
)
def test_count_problem(value: object, limit: int | None, problem: str | None) -> None:
    got = count_problem(value, limit)
    assert got is None if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(
    ("value", "kwargs", "problem"),
    [
        (0.25, {}, None),
        (None, {}, None),
        (-3.0, {}, None),
        (3, {}, None),
        (math.nan, {}, "not finite"),
        (math.nan, {"allow_nan": True}, None),
        (math.inf, {"allow_nan": True}, "not finite"),
        (-math.inf, {}, "not finite"),
        ("0.1", {}, "not a number"),
        (False, {}, "not a number"),
        (-1.0, {"minimum": 0.0}, "below"),
    ],
)
def test_metric_problem(value: object, kwargs: dict[str, Any], problem: str | None) -> None:
    got = metric_problem(value, "loss", **kwargs)
    assert got is None if problem is None else (got is not None and problem in got)


def attempt(**fields: Any) -> Attempt:
    base: dict[str, Any] = {
        "id": "a" * 32,
        "run": "r",
        "subtask_id": 1,
        "epoch": 0,
        "shard": 0,
        "number": 1,
        "worker": "w",
        "base_version": 0,
        "state": "finished",
        "samples": 250,
        "loss": 0.5,
        "train_seconds": 1.0,
    }
    return Attempt(**(base | fields))


def test_report_problem() -> None:
    assert report_problem(attempt(), {}, 250) is None
    assert "not positive" in (report_problem(attempt(samples=-5), {}, 250) or "")
    assert "exceeds" in (report_problem(attempt(samples=251), {}, 250) or "")
    assert "not an integer" in (report_problem(attempt(samples=None), {}, 250) or "")
    assert "loss" in (report_problem(attempt(loss=math.inf), {}, 250) or "")
    assert "loss" in (report_problem(attempt(loss=math.nan), {}, 250) or "")
    # A resumed attempt that trained no batch of its own has no loss.
    assert report_problem(attempt(loss=math.nan, resumed_from="b" * 32), {}, 250) is None
    assert "seconds" in (report_problem(attempt(train_seconds=-1.0), {}, 250) or "")
    partial = attempt(state="interrupted", samples=30)
    assert report_problem(partial, {"planned_samples": 250}, 250) is None
    assert "planned" in (report_problem(partial, {"planned_samples": -1}, 250) or "")
    assert "planned" in (report_problem(partial, {"planned_samples": "x"}, 250) or "")

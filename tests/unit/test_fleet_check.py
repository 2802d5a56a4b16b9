"""`vcdl fleet check`'s pure parts (vcdl/fleetcheck/: clock, verdict, render) and its CLI's errors.

Hand-made worker reports, shaped as vcdl/fleetcheck/gather.py assembles them,
go through the verdict and the rendering; hypothesis checks what must hold of
any report: a worker is ok exactly when it has no problem, the fleet is ok
exactly when every worker is, each failing worker is named on the verdict's
line, the document is strict JSON with the documented keys. The CLI's own
errors (no scheduler given, none listening) are one line, exit 2. No cluster.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl import reach  # noqa: F401  (Dask's import, paid at collection)
from vcdl.cli import main
from vcdl.fleetcheck.clock import estimate, surely_over
from vcdl.fleetcheck.render import WORKER_KEYS, document, text, verdict_line, worker_line
from vcdl.fleetcheck.verdict import Needs, judge, version_problems, worker_problems

DRIVER = {"vcdl": "0.1.0", "torch": "2.13.0+cpu", "python": "3.11.7"}
ALL = Needs(store=True, ledger=True, code=True, max_skew=5.0)
SPEC = {
    "store": {"url": "s3://bucket/vcdl", "storage_options": {}},
    "ledger": {"url": "postgresql+psycopg://vcdl:hunter2@db:5432/vcdl"},
    "code": {"specs": ["mymodel:make"]},
}


def good(name: str = "w1", **changes: Any) -> dict[str, Any]:
    """A report of a worker that can do the job; ``changes`` replace its parts."""
    report: dict[str, Any] = {
        "address": f"tls://10.0.0.{len(name)}:4000",
        "name": name,
        "host": "10.0.0.1",
        "answered": True,
        "error": None,
        "clock": {"skew_s": 0.004, "bound_s": 0.002},
        "scheduler": {"reached": True, "address": "tls://sched:8786", "tls": True},
        "store": {"ok": True, "tls": True, "error": None, "seconds": 0.05},
        "ledger": {"ok": True, "tls": True, "revision": "abc", "error": None, "seconds": 0.01},
        "versions": dict(DRIVER),
        "code": {"ok": True, "specs": ["mymodel:make"], "error": None},
        "device": {"kind": "cuda", "name": "NVIDIA H200", "count": 1, "memory_bytes": 150 << 30},
        "environment_error": None,
        "seconds": 1.5,
    }
    report.update(changes)
    return report


def silent(name: str = "w9") -> dict[str, Any]:
    return {
        "address": "tcp://10.0.0.9:4000",
        "name": name,
        "host": None,
        "answered": False,
        "error": "did not answer within 60 s",
        "clock": None,
    }


# -- clock ----------------------------------------------------------------------


def test_the_tightest_sample_gives_the_skew_and_its_bound() -> None:
    # Sent at 100, the worker said 103.0 at some moment, back at 100.2: +2.9 ± 0.1.
    wide = (100.0, 103.5, 101.0)
    tight = (100.0, 103.0, 100.2)
    skew = estimate([wide, tight])
    assert skew == {"skew_s": pytest.approx(2.9), "bound_s": pytest.approx(0.1)}
    assert estimate([]) is None
    assert estimate([(5.0, 1.0, 4.0)]) is None  # the driver's clock went back: no sample


@settings(max_examples=40)
@given(
    sent=st.floats(0, 1e9),
    rtt=st.floats(0, 10),
    offset=st.floats(-1e4, 1e4),
    at=st.floats(0, 1),
)
def test_the_true_offset_lies_within_the_bound(
    sent: float, rtt: float, offset: float, at: float
) -> None:
    # The worker read its clock somewhere in the round trip: the estimate must cover it.
    skew = estimate([(sent, sent + at * rtt + offset, sent + rtt)])
    assert skew is not None
    assert abs(skew["skew_s"] - offset) <= skew["bound_s"] + 1e-3


def test_a_skew_counts_only_when_surely_over_the_limit() -> None:
    assert not surely_over({"skew_s": 6.0, "bound_s": 1.5}, 5.0)  # might be 4.5
    assert surely_over({"skew_s": -6.0, "bound_s": 0.5}, 5.0)


# -- verdict ----------------------------------------------------------------------


def test_a_good_worker_has_no_problem() -> None:
    assert worker_problems(good(), DRIVER, ALL) == []
    verdict = judge([good("a"), good("b")], DRIVER, ALL)
    assert verdict["ok"] and verdict["problems"] == []
    assert [w["ok"] for w in verdict["workers"]] == [True, True]


@pytest.mark.parametrize(
    ("changes", "starts"),
    [
        (
            {"store": {"ok": False, "error": "permission denied writing s3://b/fleet-check/x"}},
            "store: ",
        ),
        ({"ledger": {"ok": False, "error": "connection refused"}}, "ledger: "),
        ({"store": None}, "store: not probed"),
        ({"code": {"ok": False, "error": "cannot import module 'mymodel'"}}, "code: "),
        ({"versions": {**DRIVER, "vcdl": "0.0.9"}}, "vcdl: 0.0.9, the driver's 0.1.0"),
        ({"versions": {**DRIVER, "torch": None}}, "torch: not importable"),
        ({"versions": {**DRIVER, "python": "3.12.1"}}, "python: 3.12.1, the driver's 3.11.7"),
        ({"clock": {"skew_s": -42.0, "bound_s": 0.01}}, "clock: -42.00 s off"),
        ({"environment_error": "torch: ImportError: libcudart.so"}, "torch: ImportError"),
    ],
)
def test_each_lack_is_one_problem_naming_what(changes: dict[str, Any], starts: str) -> None:
    problems = worker_problems(good(**changes), DRIVER, ALL)
    assert len(problems) >= 1 and problems[0].startswith(starts), problems


def test_what_the_run_does_not_ask_for_is_not_a_problem() -> None:
    # No config: no store, ledger or code to check; a CPU worker is fine unless CUDA is asked for.
    bare = good(store=None, ledger=None, code=None, device={"kind": "cpu", "name": "cpu"})
    assert worker_problems(bare, DRIVER, Needs()) == []
    assert worker_problems(bare, DRIVER, Needs(cuda=True)) == [
        "device: no CUDA device, and the run sets train.device = 'cuda'"
    ]
    # A patch release of Python is no mismatch; a minor one is.
    assert version_problems({**DRIVER, "python": "3.11.9"}, DRIVER) == []


def test_a_silent_worker_and_an_empty_fleet_fail() -> None:
    verdict = judge([good("a"), silent("b")], DRIVER, ALL)
    assert not verdict["ok"]
    assert verdict["workers"][1]["problems"] == ["no answer: did not answer within 60 s"]
    empty = judge([], DRIVER, ALL)
    assert not empty["ok"] and empty["problems"] == ["the scheduler has no workers"]


_parts = st.fixed_dictionaries(
    {
        "store": st.sampled_from([None, {"ok": True}, {"ok": False, "error": "denied"}]),
        "ledger": st.sampled_from([None, {"ok": True}, {"ok": False, "error": "refused"}]),
        "code": st.sampled_from([None, {"ok": True}, {"ok": False, "error": "no module"}]),
        "versions": st.sampled_from([DRIVER, {**DRIVER, "torch": "2.1.0"}]),
        "clock": st.sampled_from(
            [None, {"skew_s": 0.0, "bound_s": 0.0}, {"skew_s": 9, "bound_s": 0}]
        ),
    }
)
_reports = st.lists(
    st.one_of(_parts.map(lambda parts: good(**parts)), st.just(silent())), max_size=6
).map(lambda rs: [{**r, "name": f"w{i}"} for i, r in enumerate(rs)])


@settings(max_examples=60, deadline=None)
@given(reports=_reports, needs=st.builds(Needs, st.booleans(), st.booleans(), st.booleans()))
def test_any_fleet_is_judged_and_told_consistently(
    reports: list[dict[str, Any]], needs: Needs
) -> None:
    verdict = judge(reports, DRIVER, needs)
    for worker in verdict["workers"]:
        assert worker["ok"] == (worker["problems"] == [])
    assert verdict["ok"] == (bool(reports) and all(w["ok"] for w in verdict["workers"]))
    doc = document("tls://sched:8786", DRIVER, SPEC, verdict, needs, 60)
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc  # strict JSON, as --json prints
    assert all(list(w) == list(WORKER_KEYS) for w in doc["workers"])
    shown = text(doc).splitlines()
    assert len(shown) == len(reports) + 1  # a line per worker, then the verdict
    last = verdict_line(doc)
    assert last.startswith("fleet check: ok" if verdict["ok"] else "fleet check: FAILED")
    for worker in doc["workers"]:
        if not worker["ok"]:
            assert f"{worker['name']} (" in last  # named, with what it lacks
            assert all(p in worker_line(worker) for p in worker["problems"])


# -- render -------------------------------------------------------------------------


def test_the_document_and_the_lines() -> None:
    bad = good("gpu-b", code={"ok": False, "specs": ["mymodel:make"], "error": "no module 'x'"})
    verdict = judge([good("gpu-a"), bad, silent("gpu-c")], DRIVER, ALL)
    doc = document("tls://sched:8786", DRIVER, SPEC, verdict, ALL, 60)
    assert doc["scheduler"] == {"address": "tls://sched:8786", "tls": True}
    assert doc["checked"]["store_probe"] == "write-read-delete"
    assert "hunter2" not in json.dumps(doc)  # the ledger URL is shown redacted
    lines = text(doc).splitlines()
    assert lines[0] == (
        "ok   gpu-a tls://10.0.0.5:4000: scheduler TLS · store ok 0.05s (TLS) · "
        "ledger ok 0.01s (TLS) · clock +0.004±0.002s · vcdl 0.1.0 torch 2.13.0+cpu "
        "python 3.11.7 · code ok · NVIDIA H200 150.0 GiB"
    )
    assert lines[1].startswith("FAIL gpu-b ") and lines[1].endswith("— code: no module 'x'")
    assert lines[2] == "FAIL gpu-c tcp://10.0.0.9:4000 — no answer: did not answer within 60 s"
    assert lines[3] == (
        "fleet check: FAILED: 2 of 3 worker(s) cannot do the run's job: gpu-b (code); "
        "gpu-c (no answer) (scheduler tls://sched:8786)"
    )


# -- the CLI's own errors ---------------------------------------------------------------


def test_without_a_scheduler_it_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "check"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "vcdl: error: fleet check needs a scheduler: give --address tcp://10.0.0.5:8786 "
        "or a CONFIG whose cluster.address names one"
    )

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "check", "--address", f"tcp://127.0.0.1:{port}", "--json"])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    error = json.loads(err)["error"]
    assert error["type"] == "ConfigError" and "connection refused" in error["message"]

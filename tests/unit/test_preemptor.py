"""Whom the preemption simulator hits: a cloud warns an instance once."""

from __future__ import annotations

import json
from pathlib import Path

from vcdl.chaos import Preemptor


def test_a_notice_never_hits_a_worker_already_under_notice() -> None:
    pre = Preemptor("tcp://127.0.0.1:1", [], seed=3)
    pids = {"tcp://a:1": 101, "tcp://b:1": 102}
    pre._noticed.add(101)
    assert {pre.pick(pids, "notice") for _ in range(20)} == {"tcp://b:1"}
    # A kill may take a worker under notice (the instance goes early).
    assert {pre.pick(pids, "kill") for _ in range(40)} == {"tcp://a:1", "tcp://b:1"}
    pre._noticed.add(102)
    assert pre.pick(pids, "notice") is None


def test_a_restarted_worker_may_be_noticed_again() -> None:
    """The nanny's new process (new pid, maybe the same address) is a new instance."""
    pre = Preemptor("tcp://127.0.0.1:1", [], seed=3)
    pre._noticed.add(101)
    assert pre.pick({"tcp://a:1": 201}, "notice") == "tcp://a:1"


def test_preempt_start_reaches_the_simulator_schedule() -> None:
    """`vcdl train --preempt-start S`: a short run sees its first event S seconds in."""
    from flows.train import ChaosSpec
    from vcdl.chaos import chaos_schedule
    from vcdl.cli.parser import build_parser
    from vcdl.cli.train import chaos_of

    args = build_parser().parse_args(
        ["train", "x.toml", "--preempt", "2", "--preempt-start", "0.5"]
    )
    spec = ChaosSpec.model_validate(chaos_of(args))
    assert spec.start_after == 0.5
    events = chaos_schedule(spec.rate, 60, spec.seed, spec.notice_fraction, spec.start_after)
    assert events and events[0].at >= 0.5
    # Without the option the default holds; without --preempt there is no simulator.
    default = build_parser().parse_args(["train", "x.toml", "--preempt", "2"])
    assert ChaosSpec.model_validate(chaos_of(default)).start_after == 5.0
    assert chaos_of(build_parser().parse_args(["train", "x.toml"])) is None


def test_sent_counts_reads_what_a_simulator_log_says_was_sent(tmp_path: Path) -> None:
    from vcdl.chaos import sent_counts

    log = tmp_path / "chaos.jsonl"
    assert sent_counts(log) == {"kill": 0, "notice": 0}  # no log yet: nothing sent
    records = [
        {"kind": "kill", "outcome": "sent"},
        {"kind": "kill", "outcome": "skipped: no worker"},
        {"kind": "notice", "outcome": "sent"},
        {"kind": "kill", "outcome": "sent"},
        {"kind": "notice", "outcome": "failed: gone"},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert sent_counts(log) == {"kill": 2, "notice": 1}

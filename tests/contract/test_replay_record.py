"""What a replay needs is recorded per attempt (ledger migration 0011), on both backends."""

from __future__ import annotations

import json

from tests.contract.test_ledger import new_run
from vcdl.ledger import Ledger
from vcdl.replay.plan import replay_inputs


def test_replay_inputs_are_recorded_and_read_back(ledger: Ledger) -> None:
    new_run(ledger, "a")
    attempt = ledger.start_attempt("a", 0, 0, "w1")
    assert attempt.replay_inputs is None and replay_inputs(attempt) is None
    inputs = {"format": 1, "seed": 2**63 - 25, "start_samples": 0, "optimizer_from": None}
    ledger.record_replay_inputs(attempt.id, inputs)
    got = ledger.get_attempt(attempt.id)
    assert replay_inputs(got) == inputs
    assert json.loads(got.replay_inputs or "") == inputs
    # The row's end keeps them.
    ledger.finish_attempt(attempt.id, state="finished", result_uri="a/r", samples=10)
    assert replay_inputs(ledger.get_attempt(attempt.id)) == inputs

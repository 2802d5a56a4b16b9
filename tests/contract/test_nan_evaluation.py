"""A diverged model's evaluation (NaN loss) is recorded as such and never fatal, on both backends.

SQLite stores NaN as NULL: the NOT NULL ``evaluation.loss`` column refused the
row, and the evaluation killed the run (``NOT NULL constraint failed``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from vcdl.driver.retrain import pick_version
from vcdl.ledger import Ledger, evaluation_metrics


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    led = Ledger(url)
    led.create_run("n", json.dumps({}), "n/v0", "s0")
    yield led
    led.close()


def test_a_nan_loss_is_recorded_and_read_back_as_nan(ledger: Ledger) -> None:
    ev = ledger.record_evaluation(
        "n", 0, 0, "test", math.nan, math.nan, 10, {"perplexity": math.inf}
    )
    (back,) = ledger.evaluations("n")
    assert back.id == ev.id and back.loss is None and back.accuracy is None
    metrics = evaluation_metrics(back)
    assert math.isnan(metrics["loss"]) and metrics["perplexity"] == math.inf


def test_a_nan_evaluation_is_never_the_best_version(ledger: Ledger) -> None:
    ledger.record_evaluation("n", 0, 0, "test", 0.4, 1.5, 10)
    ledger.record_evaluation("n", 0, 1, "test", math.nan, math.nan, 10)
    evals = ledger.evaluations("n")
    assert pick_version("best", 0, evals, "accuracy") == 0
    assert pick_version("best", 5, evals, "loss", higher_is_better=False) == 0
    # Only NaNs: the head, as with no evaluation at all.
    only_nan = [e for e in evals if e.loss is None]
    assert pick_version("best", 5, only_nan, "loss", higher_is_better=False) == 5

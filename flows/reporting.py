"""Publishing what a run shows in Prefect: artifacts and events.

The content comes from :mod:`vcdl.views.artifacts` (plain data, tested without a
server); this module only hands it to Prefect. Artifact keys, for run ``R``
(lowercased, other characters turned into dashes):

- ``vcdl-R-progress``: percent of the run's subtasks finished, updated as
  shards are merged;
- ``vcdl-R-epoch-N``: a table for epoch N (accuracy, loss, merges, reissues,
  rejections, mean staleness, goodput, head version, wall time);
- ``vcdl-summary-R``: markdown with the run's lineage, the per-epoch table,
  the progress plot (also stored at ``runs/R/plots/progress.png`` in the weight
  store), the driver's log file and metrics endpoint when it has them, the
  ``vcdl story`` commands that tell what happened to a subtask, and how to
  export the model.

Numbers in the tables are rounded for reading (vcdl/views/artifacts.py):
metrics to 4 significant digits, seconds to a tenth, dollars to the cent (4
significant digits below $1).

Events (for automations): ``vcdl.run.failed`` and
``vcdl.retrain.accuracy-dropped``, ``vcdl.retrain.completed``,
``vcdl.retrain.skipped``, each on the resource ``vcdl.run.<run>``.
Publishing never fails a run: errors are logged and swallowed.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import UUID

from vcdl.ledger import utcnow
from vcdl.redact import redact_text, redact_url
from vcdl.runtime import RunRef
from vcdl.states import TERMINAL_SUBTASK_STATES
from vcdl.views.artifacts import (
    FINGERPRINT_ATTR,
    PLOT_PATH,
    artifact_key,
    epoch_metrics,
    png_data_uri,
    progress_percent,
    progress_png,
    summary_markdown,
)
from vcdl.views.cost import run_cost_report
from vcdl.views.epochs import read_epoch_views

log = logging.getLogger(__name__)


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log


def run_cost(ref: RunRef, epoch: int | None = None) -> dict[str, Any] | None:
    """The cost report as of now, of the run or one epoch (None, with a warning, if unpriced)."""
    try:
        cost = ref.config().cost
        return run_cost_report(ref.ledger(), ref.run, cost, until=utcnow(), epoch=epoch)
    except Exception as exc:
        _logger().warning("cost not computed: %s", exc)
        return None


def run_rows(
    ref: RunRef, cost: dict[str, Any] | None = None, epoch: int | None = None
) -> list[dict[str, Any]]:
    """Per-epoch metrics from the ledger (of ``epoch`` only, if given: its rows only),
    with cost columns when ``cost`` is given."""
    ledger = ref.ledger()
    return epoch_metrics(
        read_epoch_views(ledger, ref.run, epoch),
        started=ledger.get_run(ref.run).created_at,
        costs=cost["history"] if cost is not None else None,
    )


def run_progress(ref: RunRef, epochs: int, shards: int) -> float:
    # A count in the ledger: this runs in the driver's merge loop (once a
    # second), where loading every subtask of a long run took 0.24 s at 10 000.
    done = ref.ledger().count_subtasks(ref.run, TERMINAL_SUBTASK_STATES)
    return progress_percent(done, epochs * shards)


def start_progress(ref: RunRef, epochs: int, shards: int) -> str | None:
    """Create the run's progress artifact; its id (as text) or None if Prefect refused."""
    from prefect.artifacts import create_progress_artifact

    try:
        return str(
            create_progress_artifact(
                run_progress(ref, epochs, shards),
                key=artifact_key("vcdl", ref.run, "progress"),
                description=f"vcdl run {ref.run}: % of {epochs} × {shards} subtasks finished",
            )
        )
    except Exception as exc:
        _logger().warning("progress artifact not created: %s", exc)
        return None


class ProgressUpdater:
    """Updates the progress artifact, at most every ``interval`` seconds unless forced."""

    def __init__(
        self, ref: RunRef, artifact_id: str | None, epochs: int, shards: int, interval: float = 1.0
    ) -> None:
        self.ref, self.artifact_id = ref, artifact_id
        self.epochs, self.shards, self.interval = epochs, shards, interval
        self._last = 0.0

    def __call__(self, force: bool = False) -> None:
        if self.artifact_id is None:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        from prefect.artifacts import update_progress_artifact

        try:
            update_progress_artifact(
                UUID(self.artifact_id), run_progress(self.ref, self.epochs, self.shards)
            )
        except Exception as exc:
            _logger().warning("progress artifact not updated: %s", exc)


def publish_epoch_table(ref: RunRef, epoch: int) -> list[dict[str, Any]]:
    """The table artifact of one epoch, from that epoch's rows only; returns its rows."""
    from prefect.artifacts import create_table_artifact

    rows = run_rows(ref, run_cost(ref, epoch), epoch)
    try:
        create_table_artifact(
            rows,
            key=artifact_key("vcdl", ref.run, "epoch", epoch),
            description=f"vcdl run {ref.run}, epoch {epoch}",
        )
    except Exception as exc:
        _logger().warning("epoch table artifact not created: %s", exc)
    return rows


def save_plot(ref: RunRef, rows: list[dict[str, Any]]) -> tuple[str, bytes]:
    """Render the progress plot and store it next to the run's versions; (URI, PNG)."""
    import fsspec

    png = progress_png(rows, title=f"vcdl run {ref.run}")
    store = ref.store()
    uri = store.uri(PLOT_PATH.format(run=ref.run))
    fs, path = fsspec.core.url_to_fs(uri, **ref.storage_options)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(png)
    return uri, png


def data_fingerprint(ref: RunRef) -> str | None:
    """The data set fingerprint recorded with the run's v0 (None for runs from before)."""
    try:
        v0 = ref.ledger().get_version(ref.run, 0)
        value = ref.store().read_attrs(v0.uri).get(FINGERPRINT_ATTR)
    except Exception:
        return None
    return str(value) if value else None


def publish_summary(
    ref: RunRef,
    summary: dict[str, Any],
    log_file: str | None = None,
    metrics_url: str | None = None,
) -> None:
    """The run's markdown summary, with the progress plot embedded, naming the
    driver's log file and metrics endpoint where there are such."""
    from prefect.artifacts import create_markdown_artifact

    cost = run_cost(ref)
    rows = run_rows(ref, cost)
    plot_uri = image = None
    try:
        plot_uri, png = save_plot(ref, rows)
        image = png_data_uri(png)
    except Exception as exc:
        _logger().warning("progress plot not written: %s", exc)
    try:
        create_markdown_artifact(
            key=artifact_key("vcdl", "summary", ref.run),
            markdown=summary_markdown(
                summary,
                rows,
                redact_url(plot_uri) if plot_uri else None,
                image,
                data_fingerprint(ref),
                cost,
                log_file,
                redact_url(metrics_url) if metrics_url else None,
            ),
            description=f"vcdl run {ref.run}",
        )
    except Exception as exc:
        _logger().warning("summary artifact not created: %s", exc)


def emit(event: str, run: str, payload: dict[str, Any] | None = None) -> None:
    """Emit a Prefect event about run ``run`` (resource ``vcdl.run.<run>``).

    Every URL in the payload's strings (an error message, say) is redacted.
    """
    from prefect.events import emit_event

    shown = {k: redact_text(v) if isinstance(v, str) else v for k, v in (payload or {}).items()}
    try:
        emit_event(
            event=event,
            resource={"prefect.resource.id": f"vcdl.run.{run}", "prefect.resource.name": run},
            payload=shown,
        )
    except Exception as exc:
        _logger().warning("event %s not emitted: %s", event, exc)


def publish_table(key: str, rows: list[dict[str, Any]], description: str) -> None:
    from prefect.artifacts import create_table_artifact

    try:
        create_table_artifact(rows, key=key, description=description)
    except Exception as exc:
        _logger().warning("table artifact %s not created: %s", key, exc)

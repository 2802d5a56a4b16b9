"""What a run shows in Prefect, as plain data: epoch tables, summaries, plots.

This module owns the *content* of the artifacts the flows publish (the
per-epoch metrics table, the markdown summary with the run's lineage, the
progress plot). Nothing here talks to Prefect:
``flows/reporting.py`` publishes what these functions build, so all of it is
testable without a server.
"""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from vcdl.views.epochs import EpochView, format_metrics

PLOT_PATH = "runs/{run}/plots/progress.png"
# Where a run records the data set it was trained on (v0's group attributes).
FINGERPRINT_ATTR = "data_fingerprint"


def artifact_key(*parts: object) -> str:
    """A Prefect artifact key: lowercase letters, digits and dashes only."""
    text = "-".join(str(p) for p in parts).lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")


def epoch_metrics(
    views: Iterable[EpochView],
    started: datetime | None = None,
    costs: Iterable[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One table row per epoch of :func:`vcdl.views.epochs.epoch_views`.

    Columns: epoch, test accuracy and loss, merges, reissues (attempts
    beyond the first), rejections, mean staleness of the epoch's versions,
    goodput (training seconds that reached a merged version / all training
    seconds), head version, the wall time from ``started`` (the run's
    creation) to the epoch's evaluation, and the bytes of training data
    read and of results and checkpoints written (``data_bytes``,
    ``written_bytes``). With ``costs`` (the ``history`` of
    :func:`vcdl.views.cost.cost_summary`), also the epoch's spot cost and the
    part of it wasted (``cost_usd``, ``waste_usd``).
    """
    by_epoch = {int(c["epoch"]): c for c in costs} if costs is not None else None
    rows = []
    for v in views:
        wall = (
            seconds((v.evaluated_at - started).total_seconds())
            if v.evaluated_at is not None and started is not None
            else None
        )
        row: dict[str, Any] = {
            "epoch": v.epoch,
            "accuracy": significant(v.test_accuracy),
            "loss": significant(v.test_loss),
            "merges": v.merged,
            "reissues": v.reissues,
            "rejections": v.rejections,
            "mean_staleness": significant(v.mean_staleness),
            "goodput": significant(v.goodput),
            "version": v.version,
            "wall_seconds": wall,
            "data_bytes": v.data_bytes,
            "written_bytes": v.written_bytes,
        }
        # The objective's other metrics (perplexity, token accuracy, rmse, the user's).
        row |= {
            k: significant(x)
            for k, x in sorted(v.test_metrics.items())
            if k not in ("accuracy", "loss")
        }
        if by_epoch is not None:
            c = by_epoch.get(v.epoch, {})
            row["cost_usd"] = usd(c.get("total_usd"))
            row["waste_usd"] = usd(c.get("waste_usd"))
        rows.append(row)
    return rows


# -- the precision a table shows ------------------------------------------------------


def significant(x: float | None, digits: int = 4) -> float | None:
    """``x`` to ``digits`` significant digits (metrics: 2.1037281799316405 -> 2.104)."""
    if x is None or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def seconds(x: float | None) -> float | None:
    """Seconds to a tenth."""
    return round(x, 1) if x is not None and math.isfinite(x) else x


def usd(x: float | None) -> float | None:
    """Dollars to the cent from $1 on; below, 4 significant digits (a small
    run's epoch costs millionths of a dollar)."""
    if x is None or not math.isfinite(x):
        return x
    return round(x, 2) if abs(x) >= 1 else significant(x)


def dollars(x: float) -> str:
    """``usd(x)`` as text: ``$12.35``, ``$0.01235``, ``$6.854e-06``, ``$0``."""
    value = usd(x)
    assert value is not None
    if abs(value) >= 1:
        return f"${value:.2f}"
    return f"${value:.4g}"


def progress_percent(done: int, total: int) -> float:
    """Percent of a run's subtasks that are finished (merged, dropped or failed)."""
    if total <= 0:
        return 100.0
    return round(min(100.0, 100.0 * done / total), 2)


def progress_png(rows: Sequence[dict[str, Any]], title: str = "") -> bytes:
    """A PNG of test accuracy and loss against epoch (top) and wall time (bottom)."""
    import matplotlib

    matplotlib.use("Agg")  # no display; safe in worker and flow processes
    from matplotlib.figure import Figure

    pts = [r for r in rows if r.get("loss") is not None]
    epochs = [r["epoch"] for r in pts]
    walls = [r["wall_seconds"] if r.get("wall_seconds") is not None else 0.0 for r in pts]
    # Accuracy where the objective has one (classification); loss for every job.
    has_acc = any(r.get("accuracy") is not None for r in pts)
    acc = [r["accuracy"] if r.get("accuracy") is not None else float("nan") for r in pts]
    loss = [r["loss"] for r in pts]
    fig = Figure(figsize=(6.4, 5.2), dpi=80)
    for i, (xs, label) in enumerate(((epochs, "epoch"), (walls, "wall time (s)"))):
        ax = fig.add_subplot(2, 1, i + 1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        loss_ax = ax
        if has_acc:
            ax.plot(xs, acc, "o-", color="tab:blue", label="test accuracy")
            ax.set_ylabel("accuracy", color="tab:blue")
            ax.set_ylim(0, 1)
            loss_ax = ax.twinx()
        loss_ax.plot(xs, loss, "s--", color="tab:red", label="test loss")
        loss_ax.set_ylabel("loss", color="tab:red")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _fmt(value: Any, spec: str = ".4f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def summary_markdown(
    s: dict[str, Any],
    rows: Sequence[dict[str, Any]] = (),
    plot_uri: str | None = None,
    plot_image: str | None = None,
    fingerprint: str | None = None,
    cost: Mapping[str, Any] | None = None,
    log_file: str | None = None,
    metrics_url: str | None = None,
) -> str:
    """The run's summary: state, lineage, per-epoch table, cost, the `vcdl story` commands
    that tell what happened to a subtask, plot, how to export.

    ``s`` is :func:`vcdl.views.status.run_status`'s summary; ``rows`` are
    :func:`epoch_metrics`; ``plot_image`` an image URL (e.g. a data URI)
    embedded in the page, ``plot_uri`` where the PNG is stored; ``cost`` is
    :func:`vcdl.views.cost.cost_report`'s report; ``log_file`` the driver's log
    (``vcdl train`` writes one), ``metrics_url`` where its metrics are served.
    """
    run = s["run"]
    lines = [
        f"# vcdl run `{run}`",
        "",
        f"State **{s['state']}**, {s['epochs_completed']}/{s['epochs']} epochs, "
        f"head v{s['head_version']}, test {format_metrics(s.get('test_metrics') or {})}.",
        "",
        "## Lineage",
        "",
    ]
    if s.get("parent_run") is not None:
        lines.append(
            f"Warm-started from run `{s['parent_run']}` version v{s['parent_version']}: "
            f"v0 of `{run}` is that version's weights."
        )
    else:
        lines.append("Trained from a fresh initialization (no parent run).")
    lines.append(
        f"Data set `{s.get('data')}`" + (f", fingerprint `{fingerprint}`." if fingerprint else ".")
    )
    priced = any("cost_usd" in r for r in rows)
    lines += [
        "",
        "## Epochs",
        "",
        "| epoch | accuracy | loss | merges | reissues | rejections | mean staleness "
        "| goodput | version | wall (s) | read (MB) | wrote (MB) |"
        + (" spot $ | wasted $ |" if priced else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if priced else ""),
    ]
    for r in rows:
        lines.append(
            f"| {r['epoch']} | {_fmt(r['accuracy'])} | {_fmt(r['loss'])} | {r['merges']} | "
            f"{r['reissues']} | {r['rejections']} | {_fmt(r['mean_staleness'], '.2f')} | "
            f"{_fmt(r['goodput'], '.1%')} | {_fmt(r['version'])} | "
            f"{_fmt(r['wall_seconds'], '.1f')} | {r.get('data_bytes', 0) / 1e6:.1f} | "
            f"{r.get('written_bytes', 0) / 1e6:.1f} |"
            + (f" {_money(r.get('cost_usd'))} | {_money(r.get('waste_usd'))} |" if priced else "")
        )
    if cost is not None:
        lines += ["", "## Cost", "", *_cost_lines(cost)]
    if log_file or metrics_url:
        lines += ["", "## Log and metrics", ""]
        if log_file:
            lines.append(f"- The driver's full log (Prefect, Dask, the workers): `{log_file}`")
        if metrics_url:
            lines.append(f"- Metrics of the driver (Prometheus): <{metrics_url}>")
    lines += ["", "## The story of a subtask", "", *_story_lines(run, rows)]
    if plot_image or plot_uri:
        lines += ["", "## Progress", ""]
        if plot_image:
            lines.append(f"![accuracy and loss of {run}]({plot_image})")
        if plot_uri:
            lines += ["", f"Plot stored at `{plot_uri}`."]
    lines += [
        "",
        "## Export the model",
        "",
        "```bash",
        f"vcdl export {run} --out model.safetensors          # head; --version N for others",
        f"vcdl evaluate {run} --version {s['head_version']}",
        "```",
        "",
        "```python",
        "from vcdl import api",
        "from vcdl.driver.runs import export_version",
        f'export_version(api.run_ref("{run}"), "model.safetensors")',
        "```",
    ]
    return "\n".join(lines)


def _story_lines(run: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """Which `vcdl story` command tells what happened to a subtask (vcdl/views/story.py)."""
    lines = [
        f"`vcdl story {run} --epoch E --shard S` tells everything that happened to a subtask: "
        "its attempts, workers, kills, notices, reissues, rejections, the merge and its version. "
        f"`vcdl story {run} --epoch E` lists an epoch's subtasks, `vcdl story {run}` the run's; "
        f"`vcdl workers {run}` shows each worker's pace, losses and the staleness of its merges."
    ]
    eventful = [r for r in rows if r.get("reissues") or r.get("rejections")]
    if eventful:
        # The epoch a reader most likely wants explained: the one with the most reissues.
        worst = max(eventful, key=lambda r: (r.get("reissues", 0), r.get("rejections", 0)))
        lines += [
            "",
            f"Epoch {worst['epoch']} had the most reissues ({worst.get('reissues', 0)}) and "
            f"{worst.get('rejections', 0)} rejection(s): "
            f"`vcdl story {run} --epoch {worst['epoch']}`.",
        ]
    return lines


def _cost_lines(c: Mapping[str, Any]) -> list[str]:
    """The cost report as a short markdown list (definitions: vcdl/views/cost.py)."""
    types = ", ".join(
        f"`{k}` (spot ${t['spot_per_hour']:.4f}/h, on-demand ${t['on_demand_per_hour']:.4f}/h)"
        for k, t in c.get("instance_types", {}).items()
    )
    lines = [
        f"- Spot cost **{_dollars(c['total_usd'])}** over {c['worker_seconds']:.0f} worker-seconds "
        f"({c['attempts']} attempts, {c['merged']} merged); wasted {_dollars(c['waste_usd'])}"
        + (f" ({c['waste_share']:.1%})" if c.get("waste_share") is not None else "")
        + ".",
        f"- On-demand, same seconds: {_dollars(c['on_demand_equivalent_usd'])}; on-demand cost of "
        f"the merged work: {_dollars(c['on_demand_merged_usd'])}.",
    ]
    if c.get("realized_savings") is not None and c.get("spot_discount") is not None:
        lines.append(
            f"- Realized savings **{c['realized_savings']:.1%}** against a spot discount of "
            f"{c['spot_discount']:.1%} (waste cost {c['savings_gap_points']:.1f} points)."
        )
    if c.get("usd_per_merged_sample"):
        lines.append(f"- {_dollars(c['usd_per_merged_sample'] * 1e6)} per million merged samples.")
    lines.append(
        f"- Instance types: {types or '-'}; prices as of {c.get('prices_as_of')}. "
        f"Seconds of killed attempts are upper bounds ({c.get('upper_bound_seconds', 0):.0f} s). "
        f"`vcdl cost {c['run']}` for the full report."
    )
    return lines


def _dollars(x: float) -> str:
    return dollars(x)


def _money(x: float | None) -> str:
    return "-" if x is None else dollars(x).removeprefix("$")


# -- retraining -----------------------------------------------------------------

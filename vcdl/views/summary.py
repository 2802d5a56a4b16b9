"""The text of a run's summary (``vcdl train``'s last words, ``vcdl status``), fitted to a width.

Pure: :func:`summary_lines` turns :func:`vcdl.views.status.run_status`'s
summary into lines no wider than ``width`` (a terminal's), long lists broken
after a comma and indented; with no width (a pipe) only the per-phase list,
the longest, is broken up.
"""

from __future__ import annotations

import textwrap
from typing import Any

from vcdl.views.epochs import format_metrics

#: Width of the per-phase lines when the output has no width (a pipe).
PIPE_WIDTH = 100


def _wrap(text: str, width: int | None, indent: str = "  ") -> list[str]:
    if width is None or len(text) <= width:
        return [text]
    return textwrap.wrap(
        text, width=width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def _listing(title: str, items: list[str], width: int | None) -> list[str]:
    """``title`` then the items, comma-separated, on indented lines of at most ``width``."""
    # A no-break space keeps each "name value" together (textwrap splits on ASCII only).
    body = ", ".join(item.replace(" ", "\u00a0") for item in items)
    w = max(width or PIPE_WIDTH, 20)
    if len(title) + 1 + len(body) <= w and width is not None:
        lines = [f"{title} {body}"]
    else:
        lines = [title, *textwrap.wrap(body, width=w, initial_indent="  ", subsequent_indent="  ")]
    return [line.replace("\u00a0", " ") for line in lines]


def summary_lines(summary: dict[str, Any], width: int | None = None) -> list[str]:
    """The summary as text lines; ``width`` is the terminal's (None: do not wrap)."""
    width = max(width, 40) if width is not None else None
    metrics = summary.get("test_metrics") or {}
    out = _wrap(
        f"run {summary['run']}: {summary['state']}, {summary['epochs_completed']}/"
        f"{summary['epochs']} epochs, head v{summary['head_version']}, "
        f"test {format_metrics(metrics, 'accuracy')}",
        width,
    )
    if summary.get("emulated_speeds"):
        speeds = ", ".join(f"{x:g}" for x in summary["emulated_speeds"])
        out += _wrap(
            f"workers ran at emulated speeds ({speeds}): their waits are in the timings as "
            "emulated_wait",
            width,
        )
    # The per-epoch column: accuracy where the objective has one, else the loss.
    by_acc = any(h["test_accuracy"] is not None for h in summary["history"])
    column = "accuracy" if by_acc else "loss"
    # A table row cannot wrap: the data columns (70 characters in all) only where they fit.
    io = width is None or width >= 70
    head: tuple[str, ...] = ("epoch", "merged", "attempts", "version", "staleness", column)
    widths: tuple[int, ...] = (5, 8, 8, 7, 9, 8)
    if io:
        head, widths = (*head, "read MB", "wrote MB"), (*widths, 9, 9)
    out.append(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for h in summary["history"]:
        stale = f"{h['mean_staleness']:.2f}" if h["mean_staleness"] is not None else "-"
        value = h["test_accuracy"] if by_acc else h.get("test_loss")
        acc_e = f"{value:.4f}" if value is not None else "-"
        version = f"v{h['version']}" if h["version"] is not None else "-"
        out.append(
            f"{h['epoch']:>5} {h['merged']:>4}/{h['subtasks']:<3} {h['attempts']:>8} "
            f"{version:>7} {stale:>9} {acc_e:>8}"
            + (
                f" {h.get('data_bytes', 0) / 1e6:>9.1f} {h.get('written_bytes', 0) / 1e6:>9.1f}"
                if io
                else ""
            )
        )
    attempts = summary.get("attempts", {})
    out += _wrap("attempts: " + ", ".join(f"{k} {v}" for k, v in attempts.items()), width)
    mean_stale = summary.get("mean_staleness")
    goodput = summary.get("goodput")
    out += _wrap(
        f"kills {summary.get('kills', 0)}, resumed from a checkpoint "
        f"{summary.get('resumed', 0)} ({summary.get('salvaged_seconds', 0.0):.1f} s of "
        f"training salvaged), reissues {summary.get('reissues', 0)}, "
        f"rejections {summary.get('rejections', 0)}, duplicates {summary.get('duplicates', 0)}, "
        f"mean staleness {f'{mean_stale:.2f}' if mean_stale is not None else '-'}, "
        f"goodput {f'{goodput:.1%}' if goodput is not None else '-'}",
        width,
    )
    failures = summary.get("checkpoint_failures", 0)
    if failures:
        out += _wrap(
            f"warning: {failures} checkpoint write(s) failed (the workers' logs say why); "
            "a kill loses the training since the last checkpoint written",
            width,
        )
    phases = summary.get("phases") or {}
    if phases:
        order = sorted(phases.items(), key=lambda kv: -kv[1])
        out += _listing(
            "per merged attempt, mean seconds:", [f"{k} {v:.3f}" for k, v in order], width
        )
    return out

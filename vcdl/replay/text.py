"""A replay's report as lines for the terminal (``vcdl replay`` without ``--json``)."""

from __future__ import annotations

from vcdl.replay.runner import ReplayReport


def replay_text(report: ReplayReport) -> str:
    """The verdict first, then what was re-made and what it cost."""
    d = report.divergence
    if d is None:
        head = f"run {report.run}: versions {report.first + 1}-{report.last} replayed bit for bit"
    else:
        where = f"tensor {d.tensor}" if d.tensor else "tensor unknown"
        dev = f", largest |Δ| {d.max_abs_deviation:.3g}" if d.max_abs_deviation is not None else ""
        head = (
            f"run {report.run}: first divergence at version {d.version} (attempt "
            f"{d.attempt[:12]}, epoch {d.epoch}, shard {d.shard}), {where}{dev}: {d.detail}"
        )
    ratio = (
        f" ({report.seconds / report.original_train_seconds:.2f}x the original training's "
        f"{report.original_train_seconds:.1f} s)"
        if report.original_train_seconds > 0
        else ""
    )
    lines = [
        head,
        f"  {report.versions} versions re-made, {report.compared} compared with the ledger's "
        f"checksum; {report.trainings} trainings redone on cpu",
        f"  {report.seconds:.1f} s{ratio}, of which re-training {report.train_seconds:.1f} s "
        f"(training loops {report.loop_seconds:.1f} s)",
    ]
    off = [d for d in report.deviations if d.max_abs_deviation != 0.0]
    if report.deviations:
        lines.append(
            f"  largest deviation from the stored weights: {len(off)} of "
            f"{len(report.deviations)} versions differ"
            + (f", most {max(d.max_abs_deviation for d in off):.3g}" if off else "")
        )
    # The 20 largest, in version order: enough to see where and how far.
    worst = sorted(sorted(off, key=lambda d: -d.max_abs_deviation)[:20], key=lambda d: d.version)
    lines += [f"    v{d.version}: {d.max_abs_deviation:.3g} ({d.tensor})" for d in worst]
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)

"""The terminal display's pure parts: the model, the plain lines and their pace, the summary."""

from __future__ import annotations

import io
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from vcdl.display import Display, plain, render
from vcdl.views.live import LiveModel, PlainPacer, clock, plain_line
from vcdl.views.observe import (
    EpochPassed,
    EpochProgress,
    Evaluated,
    Merged,
    RunOpened,
    listened,
    listening,
    tell,
)
from vcdl.views.summary import summary_lines


def _run(model: LiveModel) -> None:
    model.handle(RunOpened("r", epochs=2, shards=4, epochs_completed=0, head_version=0), 1.0)


def test_model_follows_a_run() -> None:
    m = LiveModel(started=0.0, run="r")
    f = m.fields(0.5)
    assert f.epoch is None and "starting" in plain_line(f)
    _run(m)
    m.handle(EpochProgress(0, 4, 0, {}), 10.0)
    f = m.fields(10.0)
    assert (f.epoch, f.done, f.shards, f.head_version, f.left) == (0, 0, 4, 0, None)
    m.handle(Merged(0, 1, 1), 11.0)
    m.handle(EpochProgress(0, 4, 1, {"merged": 1}), 11.0)
    m.handle(Merged(0, 2, 2), 12.0)
    m.handle(EpochProgress(0, 4, 2, {"merged": 2, "killed": 1, "reissued": 1}), 12.0)
    f = m.fields(12.0)
    assert (f.done, f.head_version, f.kills, f.reissues, f.rejections) == (2, 2, 1, 1, 0)
    # 2 shards in 2 s since training began, 6 to go: 6 s.
    assert f.left == 6.0 and f.elapsed == 12.0
    assert m.handle(EpochPassed(0, 4, 3.0), 14.0)  # a milestone
    m.handle(EpochProgress(1, 4, 0, {"rejected": 2}), 14.0)
    assert m.handle(Evaluated(0, 4, {"accuracy": 0.90277, "loss": 0.31}, "accuracy"), 14.5)
    f = m.fields(15.0)
    assert (f.epoch, f.done, f.head_version, f.rejections, f.kills) == (1, 0, 4, 2, 1)
    assert f.metrics == "accuracy 0.9028, loss 0.3100 (epoch 0)"
    assert f.left == 5.0 * 4 / 4  # 4 shards in 5 s, 4 to go
    line = plain_line(f)
    assert line.startswith("epoch 2/2 · shards 0/4 · head v4 · test accuracy 0.9028")
    assert "kills 1, reissues 1, rejections 2" in line and "15s elapsed, ~5s left" in line
    m.handle(EpochProgress(1, 4, 4, {"merged": 4}), 16.0)
    m.handle(EpochPassed(1, 8, 2.0), 16.0)
    f = m.fields(17.0)
    assert f.finished and f.left == 0.0 and "done" in plain_line(f)


def test_resumed_run_counts_earlier_sessions() -> None:
    m = LiveModel(started=0.0)
    m.handle(RunOpened("r", 4, 2, epochs_completed=2, head_version=9, kills=3, reissues=5), 1.0)
    f = m.fields(1.0)
    assert (f.epoch, f.head_version, f.kills, f.reissues) == (2, 9, 3, 5)
    m.handle(EpochProgress(2, 2, 1, {"killed": 1}), 2.0)
    m.handle(EpochProgress(2, 2, 2, {"killed": 1}), 4.0)
    f = m.fields(4.0)
    # The pace counts this session's shards only: 2 in 2 s, 2 to go.
    assert f.kills == 4 and f.left == 2.0


@given(st.lists(st.integers(0, 8), max_size=30), st.integers(1, 8))
def test_model_never_overcounts(dones: list[int], shards: int) -> None:
    m = LiveModel(started=0.0)
    m.handle(RunOpened("r", epochs=3, shards=shards, epochs_completed=0, head_version=0), 0.0)
    for i, d in enumerate(dones):
        m.handle(EpochProgress(i % 3, shards, min(d, shards), {}), float(i + 1))
        f = m.fields(float(i + 1))
        assert 0 <= f.done <= f.shards and (f.left is None or f.left >= 0)


def test_pacer_writes_milestones_at_once_and_changes_at_a_steady_pace() -> None:
    m = LiveModel(started=0.0)
    _run(m)
    p = PlainPacer(interval=5.0, quiet=60.0)
    assert p.due(m.fields(1.0), 1.0)  # the first line
    assert not p.due(m.fields(2.0), 2.0)  # nothing new but the clock
    m.handle(EpochProgress(0, 4, 1, {}), 3.0)
    assert not p.due(m.fields(3.0), 3.0)  # a change, too soon
    assert p.due(m.fields(6.1), 6.1)
    m.handle(EpochProgress(0, 4, 2, {}), 6.5)
    assert p.due(m.fields(6.5), 6.5, milestone=True)
    assert not p.due(m.fields(50.0), 50.0)
    assert p.due(m.fields(67.0), 67.0)  # the heartbeat
    assert not p.due(m.fields(68.0), 68.0, last=True)  # the final line said nothing new
    m.handle(EpochProgress(0, 4, 4, {}), 68.5)
    assert p.due(m.fields(68.5), 68.5, last=True)


def test_clock() -> None:
    assert [clock(s) for s in (None, 4.4, 65, 3725)] == ["-", "4s", "1:05", "1:02:05"]
    assert clock(float("inf")) == "-"


def test_plain_strips_escapes_and_controls() -> None:
    assert plain("\x1b[1;31mred\x1b[0m\r\x07ok\x1b]8;;http://x\x1b\\") == "red  ok"


def _listen_twice() -> list[Any]:
    seen: list[Any] = []

    def broken(event: Any) -> None:
        raise RuntimeError("a listener's bug")

    with listening(broken), listening(seen.append):
        assert listened()
        tell(Merged(0, 0, 1))
    tell(Merged(0, 1, 2))  # nobody listens any more
    return seen


def test_observe_hands_events_to_listeners_and_survives_their_errors() -> None:
    assert _listen_twice() == [Merged(0, 0, 1)]
    assert not listened()


def test_plain_display_writes_no_escapes_and_warnings_between_lines() -> None:
    import logging

    out = io.StringIO()
    with Display(out, live=False, run="r", started=0.0, plain_interval=0.0) as d:
        d.listen(RunOpened("r", 2, 4, 0, 0))
        d.listen(EpochProgress(0, 4, 1, {}))
        logging.getLogger("vcdl.test").warning("epoch 0 shard 1 \x1b[31mreissued\x1b[0m")
        import time

        time.sleep(1.2)
        d.listen(EpochProgress(0, 4, 2, {"reissued": 1}))
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text, text
    assert "warning: epoch 0 shard 1 reissued" in text
    assert re.search(r"epoch 1/2 · shards 2/4 · head v0 .*reissues 1", text), text


def test_live_render_has_bar_and_fields() -> None:
    from rich.console import Console

    m = LiveModel(started=0.0)
    _run(m)
    m.handle(EpochProgress(0, 4, 3, {"killed": 2}), 2.0)
    m.handle(Evaluated(0, 3, {"loss": 1.25}, "loss"), 2.0)
    console = Console(file=io.StringIO(), width=100, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(render(m.fields(3.0)))
    text = cap.get()
    assert "epoch 1/2" in text and "3/4 shards" in text and "head v0" in text
    assert "loss 1.250 (epoch 0)" in text and "kills 2" in text and "elapsed" in text
    assert "━" in text  # the bar


SUMMARY: dict[str, Any] = {
    "run": "r",
    "state": "completed",
    "epochs": 1,
    "epochs_completed": 1,
    "head_version": 4,
    "test_metrics": {"accuracy": 0.9, "loss": 0.31},
    "history": [
        {"epoch": 0, "merged": 4, "subtasks": 4, "attempts": 5, "version": 4,
         "mean_staleness": 0.5, "test_accuracy": 0.9, "test_loss": 0.31},
    ],
    "attempts": {"merged": 4, "killed": 1},
    "kills": 1,
    "phases": {f"phase_number_{i}": i / 7 for i in range(15)},
}  # fmt: skip


def test_summary_wraps_to_the_width() -> None:
    lines = summary_lines(SUMMARY, 60)
    assert all(len(line) <= 60 for line in lines), lines
    assert lines[:2] == [
        "run r: completed, 1/1 epochs, head v4, test accuracy 0.9000,",
        "  loss 0.3100",
    ]
    start = lines.index("per merged attempt, mean seconds:")
    phases = lines[start + 1 :]
    assert len(phases) >= 4 and all(p.startswith("  ") for p in phases)
    # Each "name value" stays on one line.
    assert all(re.fullmatch(r"  (phase_number_\d+ \d\.\d{3}(, )?)+,?", p) for p in phases), phases
    piped = summary_lines(SUMMARY, None)
    assert piped[0].startswith("run r: completed") and piped[0].endswith("loss 0.3100")
    # A pipe's lines stay whole (a script reads them), but for the long phase list.
    phase_lines = piped[piped.index("per merged attempt, mean seconds:") + 1 :]
    assert len(phase_lines) >= 2 and max(len(line) for line in phase_lines) <= 100

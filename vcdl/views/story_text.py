"""The text of ``vcdl story``: a subtask's timeline, an epoch's subtasks, a run's summary.

Pure: :func:`story_text` turns :func:`vcdl.views.story.read_story`'s
:class:`~vcdl.views.story.RunStory` into lines no wider than ``width``
(100 by default; a line too long ends in "…", the JSON keeps everything).
Times are offsets from the run's start (``+M:SS.s``, ``+H:MM:SS.s``).

- One subtask (``--epoch E --shard S``): a header, then a line per event.
- One epoch (``--epoch E``): a line per subtask (state, version, attempts,
  first and last event, each attempt's end).
- Otherwise (the whole run, or ``--shard S`` of every epoch): the same
  lines, at most :data:`SUMMARY_LINES` unless ``every``; past that the
  uneventful subtasks (merged at their first attempt) are left out first,
  and a last line says how many were and how to see them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from vcdl.views.story import RunStory, Story, StoryEvent

WIDTH = 100
"""Width of the lines when the caller names none (a pipe): readable in any terminal."""

SUMMARY_LINES = 50
"""Subtasks a summary lists (of a run, of a shard across epochs) without ``--all``."""

_WORKER = 22  # widest worker column; longer addresses lose their middle

_WHAT = {
    "started": "started",
    "reissued": "reissued",
    "returned": "returned",
    "notice": "notice",
    "killed": "killed",
    "timeout": "timed out",
    "failed": "failed",
    "rejected": "rejected",
    "duplicate": "duplicate",
    "merged": "merged",
    "pruned": "pruned",
    "closed": "closed",
    "handed_back": "handed back",
    "reissue": "reissuing",
    "decided": "decided",
}

#: Words an event's detail starts with where its kind's one word says too little.
_LEAD = {"notice": "partial result under notice"}


def offset(seconds: float) -> str:
    """``seconds`` from the run's start as ``+M:SS.s`` (``+H:MM:SS.s`` past an hour)."""
    sign = "-" if seconds < 0 else "+"
    tenths = round(abs(seconds) * 10)
    h, rest = divmod(tenths, 36000)
    m, t = divmod(rest, 600)
    s = f"{t // 10:02d}.{t % 10}"
    return f"{sign}{h}:{m:02d}:{s}" if h else f"{sign}{m}:{s}"


def short_worker(worker: str | None, width: int = _WORKER, *, name: str | None = None) -> str:
    """A worker's address without its scheme, after its Dask name where it has one of
    its own (``spot-3@10.0.1.7:40123``), the middle elided past ``width``."""
    if not worker:
        return ""
    label = (f"{name}@" if name and name != worker else "") + worker.split("://", 1)[-1]
    if len(label) <= width:
        return label
    keep = width - 1
    return label[: keep - keep // 2] + "…" + label[len(label) - keep // 2 :]


def fit(line: str, width: int | None) -> str:
    """``line`` on one line (a reason may span several: an exception's message), cut to
    ``width`` characters, the cut marked with "…"."""
    line = "".join(c if c.isprintable() else " " for c in line)
    if width is None or len(line) <= width:
        return line
    return line[: width - 1].rstrip() + "…"


def _event_line(e: StoryEvent, workers: int) -> str:
    number = f"#{e.attempt}" if e.attempt is not None else ""
    what = _WHAT[e.kind]
    if e.kind in ("merged", "pruned") and e.version is not None:
        what += f" v{e.version}"
    detail = ", ".join(p for p in (_LEAD.get(e.kind, ""), e.detail) if p)
    if e.kind == "reissue" and detail:
        detail = f"because {detail}"
    worker = short_worker(e.worker, name=e.worker_name)
    return f"{offset(e.seconds):>10} {number:>3} {what:<11} {worker:<{workers}}  {detail}"


def _headline(s: Story) -> str:
    where = f"epoch {s.epoch} shard {s.shard}"
    if s.merged_version is not None:
        state = f"merged as v{s.merged_version}"
    else:
        state = s.state + (f" ({s.reason})" if s.reason else "")
    n = len(s.outcomes)
    return f"{where}: {state}, {n} attempt{'' if n == 1 else 's'}"


def timeline(s: Story, run: str, width: int | None = WIDTH) -> list[str]:
    """One subtask's story: a header, then a line per event."""
    workers = max((len(short_worker(e.worker, name=e.worker_name)) for e in s.events), default=0)
    lines = [f"{_headline(s)} (run {run}; times from its start)"]
    lines += [_event_line(e, workers).rstrip() for e in s.events]
    if not s.events:
        lines.append("  nothing happened to it yet")
    return [fit(line, width) for line in lines]


def _outcomes(s: Story) -> str:
    return ", ".join(f"#{n} {state}" for n, state in s.outcomes) or "no attempt yet"


def _span(s: Story) -> str:
    if not s.events:
        return ""
    return f"{offset(s.events[0].seconds)} → {offset(s.events[-1].seconds)}"


def _compact(s: Story, with_epoch: bool) -> str:
    version = f"v{s.merged_version}" if s.merged_version is not None else "-"
    head = f"{s.epoch:>5}  " if with_epoch else ""
    return (
        f"{head}{s.shard:>5}  {s.state:<8} {version:>7}  {len(s.outcomes):>8}  "
        f"{_span(s):<23}  {_outcomes(s)}"
    )


def _header(with_epoch: bool) -> str:
    head = "epoch  " if with_epoch else ""
    span = "first → last event"
    return f"{head}shard  {'state':<8} {'version':>7}  attempts  {span:<23}  attempts' ends"


def _tally(stories: Sequence[Story]) -> list[str]:
    """Two lines: the subtasks by state; the attempts, reissues and how the unmerged ended."""
    states = Counter(s.state for s in stories)
    ends = Counter(state for s in stories for _, state in s.outcomes)
    wasted = ("killed", "timeout", "failed", "rejected", "duplicate")
    notable = [f"{ends[k]} {k}" for k in wasted if ends[k]]
    partial = sum(c for k, c in ends.items() if "partial" in k)
    if partial:
        notable.append(f"{partial} partial (under notice)")
    handed = sum(s.handed_back for s in stories)
    if handed:
        notable.append(f"{handed} task{'' if handed == 1 else 's'} handed back under notice")
    reissued = sum(max(len(s.outcomes) - 1, 0) for s in stories)
    subtasks = f"{len(stories)} subtask{'' if len(stories) == 1 else 's'}: " + ", ".join(
        f"{c} {k}" for k, c in sorted(states.items())
    )
    attempts = f"{sum(ends.values())} attempts ({reissued} reissued)"
    return [subtasks, attempts + (": " + ", ".join(notable) if notable else "")]


def _chosen(stories: Sequence[Story], limit: int) -> list[Story]:
    """At most ``limit`` stories, the eventful ones first kept, in their order."""
    if len(stories) <= limit:
        return list(stories)
    eventful = [s for s in stories if s.eventful]
    if len(eventful) >= limit:
        return eventful[:limit]
    room = limit - len(eventful)
    plain = [s for s in stories if not s.eventful][:room]
    keep = {id(s) for s in eventful} | {id(s) for s in plain}
    return [s for s in stories if id(s) in keep]


def listing(told: RunStory, width: int | None = WIDTH, every: bool = False) -> list[str]:
    """A line per subtask: one epoch's, or (capped unless ``every``) the run's."""
    stories = told.stories
    with_epoch = told.epoch is None
    if told.epoch is not None:
        scope = f"run {told.run}, epoch {told.epoch}"
    elif told.shard is not None:
        scope = f"run {told.run}, shard {told.shard} of each epoch"
    else:
        scope = f"run {told.run}"
    lines = [f"{scope} (times from its start)", *_tally(stories), _header(with_epoch)]
    shown = stories if every or told.epoch is not None else _chosen(stories, SUMMARY_LINES)
    lines += [_compact(s, with_epoch) for s in shown]
    left = len(stories) - len(shown)
    if left:
        ids = {id(s) for s in shown}
        plain = sum(1 for s in stories if not s.eventful and id(s) not in ids)
        lines.append(
            f"… {left} more not shown ({plain} of them merged at their first attempt); "
            "--all lists every one"
        )
    lines.append(
        f"`vcdl story {told.run} --epoch E [--shard S]`: an epoch's subtasks, or one's whole story"
        if told.epoch is None
        else f"`vcdl story {told.run} --epoch {told.epoch} --shard S`: one subtask's whole story"
    )
    return [fit(line, width) for line in lines]


def story_text(told: RunStory, width: int | None = WIDTH, every: bool = False) -> str:
    """What ``vcdl story`` prints for ``told``: timelines for one subtask, else a listing."""
    if told.epoch is not None and told.shard is not None:
        return "\n".join(line for s in told.stories for line in timeline(s, told.run, width))
    return "\n".join(listing(told, width, every))

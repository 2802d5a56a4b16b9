"""Acceptance (issue 53, item 4): the story of a killed-and-reissued subtask, from a real run.

A one-epoch run on a LocalCluster whose model SIGKILLs its worker's process
at its first forward pass (``dies_once`` in tests/integration/broken_model.py):
an attempt dies mid-training with nothing recorded, the nanny restarts the
worker, the driver gives the attempt up as killed and the subtask is trained
again and merged. ``vcdl story`` must tell exactly that, in the terminal and
as JSON, and the run's Prefect summary must name the command that tells it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vcdl import api
from vcdl.cli import main
from vcdl.config import parse_config
from vcdl.views.artifacts import artifact_key
from vcdl.views.story import read_story

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.alone]

RUN = "kill-story"


@pytest.fixture(scope="module")
def home(prefect_api: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's home once it has completed, one worker killed on the way."""
    home = tmp_path_factory.mktemp("story")
    marker = home / "died"
    cfg = parse_config(
        {
            "run": {"name": RUN, "epochs": 1},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 2},
            "model": {
                "factory": "tests.integration.broken_model:dies_once",
                "kwargs": {"marker": str(marker)},
            },
            "cluster": {"workers": 2},
        }
    )
    summary = api.train(cfg, home=home)
    assert summary["state"] == "completed", summary
    assert marker.exists(), "no worker was killed"
    return home


def _vcdl(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as ended:
        main(["story", RUN, *args, "--home", str(home)])
    out, err = capsys.readouterr()
    assert ended.value.code in (0, None), err
    return out


def test_the_story_of_a_killed_and_reissued_subtask(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = api.run_ref(RUN, home=home).ledger()
    (killed,) = [a for a in ledger.attempts(RUN) if a.state == "killed"]
    assert killed.number == 1
    shard = killed.shard

    (story,) = read_story(ledger, RUN, epoch=0, shard=shard).stories
    steps = [(e.kind, e.attempt) for e in story.events]
    assert steps[:2] == [("started", 1), ("killed", 1)], steps
    assert "worker died" in story.events[1].detail
    assert steps[2] == ("reissued", 2), steps
    (merge,) = [e for e in story.events if e.kind == "merged"]
    assert story.state == "merged" and merge.version == story.merged_version is not None
    merged = next(a for a in ledger.attempts(RUN, 0) if a.shard == shard and a.state == "merged")
    assert merge.attempt == merged.number >= 2
    assert [e.at for e in story.events] == sorted(e.at for e in story.events)
    assert all(e.seconds > 0 for e in story.events)  # after the run's start

    out = _vcdl(home, capsys, "--epoch", "0", "--shard", str(shard))
    lines = out.splitlines()
    assert lines[0].startswith(f"epoch 0 shard {shard}: merged as v{story.merged_version}")
    assert any("#1 killed" in line and "worker died" in line for line in lines), out
    assert any(f"#{merged.number} merged v{story.merged_version}" in line for line in lines), out
    assert any("#2 reissued" in line for line in lines) and all(len(x) <= 100 for x in lines)

    out = _vcdl(home, capsys)  # the whole run, a line per subtask
    assert "2 subtasks: 2 merged" in out and "#1 killed, #2 " in out

    doc = json.loads(_vcdl(home, capsys, "--epoch", "0", "--shard", str(shard), "--json"))
    events = doc["subtasks"][0]["events"]
    assert [e["kind"] for e in events][:3] == ["started", "killed", "reissued"]
    assert any(e["kind"] == "merged" and e["version"] == story.merged_version for e in events)


def test_the_prefect_summary_names_the_story_command(home: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    key = artifact_key("vcdl", "summary", RUN)
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    assert found, f"no artifact {key!r}"
    md = str(max(found, key=lambda a: a.created or 0).data)
    assert f"`vcdl story {RUN} --epoch E --shard S` tells everything" in md
    assert f"`vcdl story {RUN} --epoch 0`" in md  # the epoch with the reissue

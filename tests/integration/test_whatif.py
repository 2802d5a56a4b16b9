"""What-if (issue 53, item 3): a run re-executed without one merged result, into a new run,
and ``vcdl diff`` of the two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_replay import config, drive
from vcdl.cli import main
from vcdl.replay.diff import diff_runs
from vcdl.replay.plan import NotReplayable
from vcdl.replay.runner import replay_run
from vcdl.replay.whatif import what_if
from vcdl.runtime import RunRef

pytestmark = pytest.mark.timeout(300)


def test_a_run_without_one_result_parts_where_it_was_merged(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    ref = drive(cfg)
    ledger = ref.ledger()
    rejected = ledger.get_version(ref.run, 3).attempt_id
    assert rejected is not None

    made = what_if(ref, "rp-without", reject=rejected[:10])
    assert made.rejected == rejected and made.merged == 5 and made.head == 5
    assert made.versions == {0: 0, 1: 1, 2: 2, 3: 2, 4: 3, 5: 4, 6: 5}
    new = RunRef(run="rp-without", ledger_url=ref.ledger_url, store_url=ref.store_url)
    rows = {v.number: v for v in ledger.versions(new.run)}
    old = {v.number: v for v in ledger.versions(ref.run)}
    # The same weights up to the rejected merge: bit for bit.
    assert [rows[n].checksum for n in (0, 1, 2)] == [old[n].checksum for n in (0, 1, 2)]
    assert rows[3].checksum != old[3].checksum
    # The new run is a run like any other: it replays bit for bit itself.
    assert replay_run(new).bit_for_bit

    d = diff_runs(ref, new)
    assert (d.common, d.parted_at, d.heads) == (2, 3, (6, 5))
    epoch, shard = (lambda a: (a.epoch, a.shard))(ledger.get_attempt(rejected))
    assert d.parted_subtask == (epoch, shard) and d.only_in_run == [(epoch, shard)]
    assert set(d.metrics) == {ref.run, new.run} and "loss" in d.metrics[new.run]

    with pytest.raises(NotReplayable, match="exists already"):
        what_if(ref, "rp-without", reject=rejected)
    with pytest.raises(NotReplayable, match="no merged attempt"):
        what_if(ref, "rp-2", reject="zz")


def test_the_cli_makes_a_what_if_and_diffs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config(tmp_path)
    ref = drive(cfg)
    assert cfg.ledger.url is not None
    rejected = ref.ledger().get_version(ref.run, 5).attempt_id or ""
    base = ["--ledger", cfg.ledger.url]
    with pytest.raises(SystemExit) as ended:
        main(["replay", ref.run, "--as", "alt", "--reject", rejected, *base, "--json"])
    out, err = capsys.readouterr()
    assert ended.value.code in (0, None), err
    assert json.loads(out)["head"] == 5
    with pytest.raises(SystemExit) as ended:
        main(["diff", ref.run, "alt", *base])
    out, err = capsys.readouterr()
    assert ended.value.code in (0, None), err
    assert out.startswith(f"{ref.run} and alt part at version 5")
    with pytest.raises(SystemExit) as ended:
        main(["replay", ref.run, "--as", "alt2", *base])
    out, err = capsys.readouterr()
    assert ended.value.code == 2 and "go together" in err

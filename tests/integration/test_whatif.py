"""What-if (issue 53, item 3): a run re-executed with one change into a new run (one merged
result rejected; another α or rule, from a version on), and ``vcdl diff`` of the two."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_replay import config, drive
from vcdl.cli import main
from vcdl.replay.diff import diff_runs
from vcdl.replay.plan import NotReplayable
from vcdl.replay.runner import replay_run
from vcdl.replay.whatif import what_if, what_if_text
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
    assert ended.value.code == 2 and "needs a change" in err


def test_another_alpha_from_a_version_on_retrains_what_follows(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    ref = drive(cfg)
    ledger = ref.ledger()
    made = what_if(ref, "rp-alpha", alpha=0.9, first=4)
    assert (made.first, made.merged, made.head, made.same_before) == (4, 6, 6, True)
    assert made.change == "α 0.9 (constant) from version 4 on" and made.rejected is None
    new = RunRef(run="rp-alpha", ledger_url=ref.ledger_url, store_url=ref.store_url)
    rows = {v.number: v for v in ledger.versions(new.run)}
    old = {v.number: v for v in ledger.versions(ref.run)}
    # Versions 1-3 as recorded (α 0.5), bit for bit; from 4 on α 0.9 and other weights.
    assert [rows[n].checksum for n in (1, 2, 3)] == [old[n].checksum for n in (1, 2, 3)]
    assert [rows[n].alpha for n in range(1, 7)] == [0.5, 0.5, 0.5, 0.9, 0.9, 0.9]
    assert all(rows[n].checksum != old[n].checksum for n in (4, 5, 6))
    # The attempts merged after v4 trained from the new run's v4 and v5, not the
    # original's: their own results differ, not only the merges.
    mine = {n: ledger.get_attempt(v.attempt_id or "") for n, v in rows.items() if n}
    theirs = {n: ledger.get_attempt(v.attempt_id or "") for n, v in old.items() if n}
    assert mine[4].loss == theirs[4].loss  # trained from v3: the same
    assert mine[5].loss != theirs[5].loss
    assert new.config().merge.alpha == 0.9 and new.config().merge.schedule == "constant"
    # Recorded like any run: it replays bit for bit, and diff says where it parts.
    assert replay_run(new).bit_for_bit
    d = diff_runs(ref, new)
    assert (d.common, d.parted_at, d.only_in_run, d.only_in_other) == (3, 4, [], [])
    text = what_if_text(made)
    assert "versions before 4: the original's, checksum for checksum" in text
    assert "re-trained from the new run's versions" in text

    # Refused before anything is written.
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"alpha": 0.9, "first": 7}, "has no version 7"),
        ({"alpha": 0.5}, "would change nothing"),
        ({"rule": "easgd"}, "kept none"),
        ({"rule": "average"}, "first version"),
    ]
    for kwargs, words in refusals:
        with pytest.raises(NotReplayable, match=words):
            what_if(ref, "rp-refused", **kwargs)
        assert ledger.find_run("rp-refused") is None


def test_another_rule_from_a_version_on_is_a_run_that_replays(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    ref = drive(cfg)
    made = what_if(ref, "rp-diloco", rule="diloco", first=3)
    assert (made.first, made.head, made.same_before, made.rule) == (3, 6, True, "diloco")
    assert any("starts afresh at version 3" in n for n in made.notes)
    ledger = ref.ledger()
    new = RunRef(run="rp-diloco", ledger_url=ref.ledger_url, store_url=ref.store_url)
    assert new.config().merge.rule == "diloco"
    rows = {v.number: v for v in ledger.versions(new.run)}
    old = {v.number: v for v in ledger.versions(ref.run)}
    assert [rows[n].checksum for n in (1, 2)] == [old[n].checksum for n in (1, 2)]
    assert rows[3].checksum != old[3].checksum
    # The versions before 3 were merged by vc_asgd: the replay of the new run knows
    # from the attempts' replay inputs, and re-makes every version bit for bit.
    report = replay_run(new)
    assert report.bit_for_bit and report.compared == 6, report.divergence
    assert diff_runs(ref, new).parted_at == 3

    # A whole-run change of rule (and α with it).
    made = what_if(ref, "rp-delta", rule="delta", alpha=0.8)
    assert made.first == 1 and made.change == "rule delta, α 0.8 (constant)"
    other = RunRef(run="rp-delta", ledger_url=ref.ledger_url, store_url=ref.store_url)
    assert replay_run(other).bit_for_bit
    assert diff_runs(ref, other).parted_at == 1


def test_the_cli_refuses_what_makes_no_sense(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config(tmp_path)
    ref = drive(cfg)
    assert cfg.ledger.url is not None
    base = ["--ledger", cfg.ledger.url]
    for extra, words in [
        (["--alpha", "0.5"], "name its new run with --as"),
        (["--rule", "delta"], "name its new run with --as"),
        (["--as", "x", "--alpha", "1.5"], "must be in (0, 1]"),
        (["--as", "x", "--alpha", "0"], "must be in (0, 1]"),
        (["--as", "x", "--rule", "nope"], "unknown rule"),
        (["--as", "x", "--reject", "ab", "--alpha", "0.7"], "does not combine"),
        (["--as", "x", "--alpha", "0.7", "--to", "3"], "--to is a replay's"),
        (["--as", "x", "--alpha", "0.7", "--keep-going"], "--keep-going is a replay's"),
        (["--as", "x", "--from", "2"], "add --alpha or --rule"),
        (["--as", "x", "--alpha", "0.7", "--from", "0"], "1 or later"),
        (["--as", "x", "--alpha", "0.7", "--from", "9"], "has no version 9"),
    ]:
        with pytest.raises(SystemExit) as ended:
            main(["replay", ref.run, *extra, *base])
        out, err = capsys.readouterr()
        assert ended.value.code == 2 and words in err, (extra, err)
        assert len(err.strip().splitlines()) == 1, err
    assert ref.ledger().find_run("x") is None
    with pytest.raises(SystemExit) as ended:
        main(["replay", ref.run, "--as", "alt", "--alpha", "0.7", "--from", "2", *base])
    out, err = capsys.readouterr()
    assert ended.value.code in (0, None), err
    assert out.startswith(f"run alt: {ref.run} α 0.7 (constant) from version 2 on, 6 merges")
    assert "note: every attempt merged from version 2 on was re-trained" in out

"""A script that starts a run at its top level, outside ``if __name__ == "__main__":``, is
refused before anything starts: a LocalCluster's workers import the script again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from vcdl.usercode import guarded_at

SOURCE = textwrap.dedent(
    """\
    import os
    from vcdl.api import train

    def main():
        return train("x.toml")

    train("x.toml")
    if __name__ == "__main__":
        train("x.toml")
    if "__main__" == __name__:
        main()
    if __name__ != "__main__":
        train("x.toml")
    x = [
        train("x.toml"),
    ]
    """
)


def test_which_top_level_lines_are_under_the_guard() -> None:
    assert guarded_at(SOURCE, 7) is False  # train() at the top
    assert guarded_at(SOURCE, 9) is True
    assert guarded_at(SOURCE, 11) is True  # either way round
    assert guarded_at(SOURCE, 13) is False  # another test
    assert guarded_at(SOURCE, 15) is False  # inside a top-level statement
    assert guarded_at(SOURCE, 5) is False  # main()'s body: its def is at the top
    assert guarded_at("def (:", 1) is None and guarded_at(SOURCE, 99) is None


SCRIPT = textwrap.dedent(
    """\
    from vcdl.usercode import unguarded_script_call

    def where():
        return unguarded_script_call()

    def main():
        return where()

    print("top", where())
    print("top-main", main())
    if __name__ == "__main__":
        print("guarded", main())
    """
)


def test_the_call_is_found_through_the_script_s_functions(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines() == [
        f"top {script}:9",
        f"top-main {script}:10",
        "guarded None",
    ]


def test_an_unguarded_train_is_refused_at_once_in_one_message(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from vcdl.api import train\n"
        f"train('{Path('examples/mnist1d.toml').resolve()}', home='{tmp_path / 'h'}')\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert f"top level of the script ({script}:2)" in out.stderr
    assert 'put the call under `if __name__ == "__main__":`' in out.stderr
    assert not (tmp_path / "h").exists()  # nothing started, nothing written

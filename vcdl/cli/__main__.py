"""``python -m vcdl.cli``: the ``vcdl`` command."""

from vcdl.cli import main

main()

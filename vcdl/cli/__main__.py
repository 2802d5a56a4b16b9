"""``python -m vcdl.cli``: the ``vcdl`` command."""

from vcdl.cli import main

# Guarded: importing the module (pkgutil.walk_packages, a docs tool) runs nothing.
if __name__ == "__main__":
    main()

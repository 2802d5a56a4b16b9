"""``python -m vcdl.ledger.migrations``: the developer's handle on the ledger's migrations.

    python -m vcdl.ledger.migrations revision -m "add attempt.kind"  # autogenerate 000N_*.py
    python -m vcdl.ledger.migrations check                           # models == migrations?
    python -m vcdl.ledger.migrations history
    python -m vcdl.ledger.migrations upgrade --url URL        # what Ledger(URL) does on open
    python -m vcdl.ledger.migrations upgrade --url URL --sql  # print the DDL, run nothing
    python -m vcdl.ledger.migrations current --url URL

``revision`` and ``check`` compare the models in :mod:`vcdl.ledger.models`
with a database at the head revision: by default a throwaway SQLite file
built on the spot, or ``--url`` (PostgreSQL reflects types more precisely).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util import CommandError

from vcdl.errors import LedgerError
from vcdl.ledger.engine import LedgerEngine
from vcdl.ledger.migrations import alembic_config, current_revision, head_revision


@contextmanager
def _database_at_head(url: str | None) -> Iterator[str]:
    """``url`` upgraded to head, or a temporary SQLite ledger at head."""
    from vcdl.ledger.queries import Ledger  # the ledger's own locked upgrade path

    with tempfile.TemporaryDirectory(prefix="vcdl-migrations-") as tmp:
        url = url or f"sqlite:///{Path(tmp) / 'ledger.db'}"
        Ledger(url).close()
        yield url


def _driver_url(url: str) -> str:
    """``url`` as the ledger connects to it (driver, no pool parameters)."""
    db = LedgerEngine(url)
    db.dispose()
    return db.engine.url.render_as_string(hide_password=False)


def _with_ruff(cfg: Config) -> Config:
    """Run ruff on the new revision (the dev extra has it), as on every other file."""
    cfg.set_section_option("post_write_hooks", "hooks", "ruff_fix, ruff_format")
    for name, options in (("ruff_fix", "check --fix -q"), ("ruff_format", "format -q")):
        cfg.set_section_option("post_write_hooks", f"{name}.type", "module")
        cfg.set_section_option("post_write_hooks", f"{name}.module", "ruff")
        cfg.set_section_option(
            "post_write_hooks", f"{name}.options", f"{options} REVISION_SCRIPT_FILENAME"
        )
    return cfg


def _next_rev_id() -> str:
    from vcdl.ledger.migrations import _scripts

    numbers = [int(s.revision) for s in _scripts().walk_revisions() if s.revision.isdigit()]
    return f"{max(numbers, default=0) + 1:04d}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vcdl.ledger.migrations",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    rev = sub.add_parser("revision", help="write a new revision from the model changes")
    rev.add_argument("-m", "--message", required=True)
    rev.add_argument("--empty", action="store_true", help="no autogenerate: an empty revision")
    rev.add_argument(
        "--url", help="compare against this database, upgraded first (default: temporary SQLite)"
    )
    chk = sub.add_parser("check", help="fail if the models differ from the migrations")
    chk.add_argument(
        "--url", help="compare against this database, upgraded first (default: temporary SQLite)"
    )
    sub.add_parser("history", help="list the revisions")
    up = sub.add_parser("upgrade", help="upgrade a ledger to head")
    up.add_argument("--url", required=True)
    up.add_argument("--sql", action="store_true", help="print the DDL instead of running it")
    cur = sub.add_parser("current", help="the revision a ledger is at")
    cur.add_argument("--url", required=True)
    args = p.parse_args(argv)

    try:
        if args.command == "revision":
            rev_id = _next_rev_id()
            if args.empty:
                cfg = _with_ruff(alembic_config())
                command.revision(cfg, message=args.message, rev_id=rev_id)
            else:
                with _database_at_head(args.url) as url:
                    cfg = _with_ruff(alembic_config(url=url))
                    command.revision(cfg, message=args.message, autogenerate=True, rev_id=rev_id)
            print("review it, then add a test; see vcdl/ledger/migrations/README.md")
        elif args.command == "check":
            with _database_at_head(args.url) as url:
                command.check(alembic_config(url=url))
        elif args.command == "history":
            command.history(alembic_config())
        elif args.command == "upgrade" and args.sql:
            command.upgrade(alembic_config(url=_driver_url(args.url)), "head", sql=True)
        elif args.command == "upgrade":
            from vcdl.ledger.queries import Ledger

            with Ledger(args.url) as ledger:
                print(f"{ledger.display_url} is at {head_revision()} (head)")
        elif args.command == "current":
            db = LedgerEngine(args.url)
            try:
                with db.engine.connect() as conn:
                    print(current_revision(conn) or "no alembic_version table")
            finally:
                db.dispose()
    except (CommandError, LedgerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``vcdl`` argument parser: its shared options, and each command group's own parsers.

:func:`build_parser` makes the top-level parser and the parents commands
share (:class:`Parents`), then lets each command module add its commands
(``add_parsers``), in the order ``vcdl --help`` lists them. A bad command
line raises :class:`UsageError`, which :func:`vcdl.cli.main` reports as
text or as JSON.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from vcdl.cli.json_output import JSON_OPTION
from vcdl.errors import ConfigError


class UsageError(Exception):
    """Bad command line; :func:`vcdl.cli.main` says so as text or as JSON."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.message, self.usage = message, usage


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.short_usage())

    def short_usage(self) -> str:
        """The usage on one line: what must be given, ``[options]`` for the rest and where
        they are listed. argparse's own block ran to 8 lines before the error's one."""
        required = [a for a in self._actions if not a.option_strings or a.required]
        formatter = argparse.HelpFormatter(self.prog, width=10_000)
        formatter.add_usage(self.usage, required, [], prefix="")
        given = formatter.format_help().strip().removeprefix(self.prog).strip()
        options = " [options]" if any(a.option_strings for a in self._actions) else ""
        return f"usage: {self.prog}{options} {given} (`{self.prog} --help` lists them)\n"


if TYPE_CHECKING:
    #: What ``add_subparsers`` returns: where a command module adds its commands.
    Subparsers = argparse._SubParsersAction[Parser]


def bounded(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` to ``high``, else a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
        if not low <= value <= high:
            shown = text if len(text) <= 20 else text[:17] + "..."
            raise argparse.ArgumentTypeError(f"{shown} is out of range: {low} to {high}")
        return value

    return parse


#: The longest run or data-set name (``run.name``, ``data.name``).
NAME_MAX = 100


def checked_name(option: str, text: str | None, what: str, *, required: bool = False) -> str | None:
    """A run or data-set name given as ``option`` (a path component), else a one-line ConfigError.

    An empty name is refused (it silently became the config's or the kind's own
    name), and a long or bad one is echoed cut short. Not an argparse ``type``:
    a usage error prints the command's whole usage, several lines.
    """
    if text is None:
        return None
    shown = repr(text if len(text) <= 40 else text[:37] + "...")
    if not text:
        problem = f"an empty {what} name"
        todo = "give one" if required else f"give one, or leave {option} out"
    elif len(text) > NAME_MAX:
        problem = f"{shown} is {len(text)} characters long"
        todo = f"give a {what} name of at most {NAME_MAX}"
    elif not re.fullmatch(r"[A-Za-z0-9_.-]+", text) or set(text) == {"."} or text.startswith("__"):
        problem = f"{shown} cannot name a {what}"
        todo = "use letters, digits, '_', '.' and '-' (not only dots, not starting with '__')"
    else:
        return text
    raise ConfigError(f"{option}: {problem}; {todo}")


#: A version number: the ledger's integers.
VERSION = bounded(0, 2**31 - 1)
#: LocalCluster worker processes (``cluster.workers``' bounds).
WORKERS = bounded(1, 1024)
#: Samples of a generated data set (at most ``data.samples``' bound).
SAMPLES = bounded(10, 10_000_000)


@dataclass(frozen=True)
class Parents:
    """Parent parsers the commands share."""

    #: ``--home`` and ``--ledger``.
    common: Parser
    #: ``--json``: a command that reports takes it and hands its document to
    #: :func:`vcdl.cli.json_output.report`.
    json: Parser

    @property
    def reporting(self) -> list[Parser]:
        """What a command that reads a run's state takes: ``--home``, ``--ledger``, ``--json``."""
        return [self.common, self.json]


def build_parser() -> argparse.ArgumentParser:
    # Here, not at the top: the command modules import this module's classes.
    from vcdl.cli import chaos, completion, data, export, fleet, replay, runs, serve, train

    common = Parser(add_help=False)
    common.add_argument(
        "--home", help="state directory (default: $VCDL_HOME or ./.vcdl)", default=None
    )
    common.add_argument(
        "--ledger", help="ledger URL for existing runs (default: sqlite under --home)"
    )
    parents = Parents(common=common, json=Parser(add_help=False, parents=[JSON_OPTION]))
    p = Parser(prog="vcdl", description="VC-ASGD training on preemptible machines.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    train.add_parsers(sub, parents)
    chaos.add_parsers(sub, parents)
    runs.add_parsers(sub, parents)
    replay.add_parsers(sub, parents)
    export.add_parsers(sub, parents)
    serve.add_parsers(sub, parents)
    data.add_parsers(sub, parents)
    fleet.add_parsers(sub, parents)
    completion.add_parsers(sub, parents)
    return p

"""What docs/spot-fleet.md's "TLS on every link" shows, read for the tests that run it.

The section's bash block, as commands (continuation lines joined, words as
the shell splits them, leading ``NAME=value`` and ``export`` assignments
apart), and its TOML block. The placeholders it uses are named here, for a
test to put its own addresses and files in their place.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CA_FILE", "LEDGER", "S3_ENDPOINT", "SCHEDULER", "TLS_DIR", "Command", "commands"]
__all__ += ["config_text"]

DOC = Path(__file__).resolve().parent.parent / "docs" / "spot-fleet.md"
TLS_DIR = "/etc/vcdl/tls"
CA_FILE = f"{TLS_DIR}/ca.pem"
SCHEDULER = "tls://10.0.0.11:8786"
S3_ENDPOINT = "https://s3.internal:9000"
LEDGER = "vcdl@db.internal:5432/vcdl"


@dataclass
class Command:
    """One line of the block: its environment assignments and the command, if any."""

    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)


def _section() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split("\n### TLS on every link\n", 1)[1].split("\n## ", 1)[0]


def _block(kind: str) -> str:
    (block,) = re.findall(rf"```{kind}\n(.*?)```", _section(), flags=re.DOTALL)
    return block


def commands() -> list[Command]:
    """The bash block's commands in order (comments and blank lines dropped)."""
    joined = _block("bash").replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "export":
            words = words[1:]
        command = Command()
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            command.env[name] = value
        command.argv = words
        out.append(command)
    return out


def config_text() -> str:
    """The section's TOML block, as written."""
    return _block("toml")

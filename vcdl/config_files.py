"""Where a run's configuration comes from: TOML files, ``--set`` overrides, the home folder.

This module owns the edges of :mod:`vcdl.config`: reading a config file (only a
regular file of bounded size, every failure one line), applying
``section.key=value`` overrides before validation, and resolving the vcdl home
(``--home``, ``$VCDL_HOME`` or ``./.vcdl``), refused when vcdl cannot write there.
The schema itself, its defaults and checks are :mod:`vcdl.config`'s.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vcdl.config import RunConfig, parse_config
from vcdl.errors import ConfigError

HOME_ENV = "VCDL_HOME"
DEFAULT_HOME = ".vcdl"


def resolve_home(home: str | Path | None = None) -> Path:
    """The state directory: the option, else ``$VCDL_HOME``, else ``./.vcdl``."""
    if home is None:
        home = os.environ.get(HOME_ENV) or DEFAULT_HOME
    return Path(home).expanduser().resolve()


def writable_home(home: str | Path | None = None) -> Path:
    """:func:`resolve_home`, refused (:class:`ConfigError`, exit 2) when vcdl cannot write there.

    A home that is a file, under one, or on a file system that takes no new
    folders (``/proc``, ``/sys``, a read-only mount) fails here in one line naming
    where it came from, before anything is written; else the first write under it
    failed, blaming ``store.url``. The check makes and removes an empty folder
    in the home (or in its nearest existing parent when it does not exist yet).
    """
    import tempfile

    path = resolve_home(home)
    if home is not None:
        option = "--home"
    elif os.environ.get(HOME_ENV):
        option = f"${HOME_ENV}"
    else:
        option = "the default home"
    there = path
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    if not there.is_dir():
        what = "is" if there == path else f"is under {there}, which is"
        raise ConfigError(
            f"{option} {path} {what} a file, not a folder: "
            "pass a folder (it is made if it does not exist)"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vcdl-probe-", dir=there))
    except OSError as exc:
        where = "" if there == path else f" (in {there})"
        raise ConfigError(
            f"{option} {path}: cannot make a folder there{where}: {exc.strerror}; "
            "pass a folder you can write to"
        ) from None
    return path


def run_log_path(home: Path, run: str) -> Path:
    """Where ``vcdl train``/``resume`` write a run's full log (run names are file-name safe)."""
    return home / "logs" / f"{run}.log"


def _parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (numbers, booleans, arrays, quoted strings), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to raw config data (before validation)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for item in overrides:
        key, sep, value = item.partition("=")
        path = key.strip().split(".")
        if not sep or len(path) < 2 or not all(path):
            # The key only: the value may be a URL with a password in it.
            raise ConfigError(
                f"bad --set {key.strip()[:100]!r}: expected section.key=value, e.g. train.lr=0.01"
            )
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"bad --set {key.strip()[:100]!r}: {part} is not a section")
            node = child
        node[path[-1]] = _parse_value(value.strip())
    return out


CONFIG_MAX_BYTES = 1 << 20
"""A run config is a few KiB; past this a file is something else (``/dev/zero`` reads forever)."""


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, turning every failure into a one-line ConfigError.

    Only a regular file of at most :data:`CONFIG_MAX_BYTES` is read (a FIFO
    or a device would block or never end).
    """
    path = Path(path)
    shown = _clip(str(path))
    try:
        if not path.is_file():
            what = "not found" if not path.exists() else "is not a regular file (a TOML file)"
            raise ConfigError(f"config file {shown} {what}")
        with path.open("rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
        if len(raw) > CONFIG_MAX_BYTES:
            raise ConfigError(
                f"config file {shown} is over {CONFIG_MAX_BYTES >> 20} MiB: not a config"
            )
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        # An OSError's text repeats the path (5,000 characters, for one).
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read config file {shown}: {why}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {shown} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {shown} nests tables too deeply to be a config") from None


def _clip(text: str, most: int = 200) -> str:
    """``text`` cut in the middle to at most ``most`` characters: a path a message repeats."""
    if len(text) <= most:
        return text
    half = (most - 3) // 2
    return f"{text[:half]}...{text[-half:]}"


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Load, override and validate a run config; the run name defaults to the file's stem."""
    data = apply_overrides(read_toml(path), overrides)
    cfg = parse_config(data)
    if cfg.run.name is None:
        stem = "".join(c if c.isalnum() or c in "_.-" else "-" for c in Path(path).stem)
        cfg = cfg.updated(run={"name": stem or "run"})
    if cfg.run.code_dir is None:
        cfg = cfg.updated(run={"code_dir": str(Path(path).resolve().parent)})
    return cfg

"""Checks of single config values that need no section: paths the OS can take, scheduler
addresses, URLs without credentials, numbers that are numbers; and :class:`Section`, the
base every section of the run config shares (unknown keys, NaN and infinity refused).

:mod:`vcdl.config`'s and :mod:`vcdl.config_ops`'s validators call these; each raises
``ValueError`` with the end of a one-line message (pydantic prefixes the key), or returns
a problem.
"""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from vcdl.redact import url_secrets

__all__ = [
    "NAME_MAX",
    "NumbersAreNumbers",
    "Section",
    "no_nul_byte",
    "no_url_secrets",
    "scheduler_address_problem",
    "usable_path",
]


def _is_number(annotation: Any) -> bool:
    """An int or float field (optional or not); never a bool one."""
    kinds = {a for a in (get_args(annotation) or (annotation,)) if a is not type(None)}
    return bool(kinds) and kinds <= {int, float}


class NumbersAreNumbers(BaseModel):
    """A config section whose number fields refuse ``true`` and ``"1"``.

    Pydantic's lax mode takes ``true`` for 1 and ``"1"`` for 1; a config file or a
    form that says so has a mistake in it. (Strict mode would also refuse a TOML
    list for a tuple field.)
    """

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        if _is_number(field.annotation) and isinstance(value, bool | str):
            # The value is shown after it (vcdl.config.format_error).
            raise ValueError("must be a number, not a string or true/false")
        items = _number_items(field.annotation, value)
        if any(isinstance(v, bool | str) for v in items):
            raise ValueError("must hold numbers, not strings or true/false")
        return value


class Section(NumbersAreNumbers):
    """A section of the run config (:mod:`vcdl.config`, :mod:`vcdl.config_ops`)."""

    # extra="forbid": a misspelt key must fail loudly, not be ignored. No float
    # may be NaN or infinite: every number of a run is a finite amount.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _number_items(annotation: Any, value: Any) -> list[Any]:
    """The items of a list of numbers, or the values of a mapping to numbers (else none)."""
    # An optional field's annotation is a union: its members; else the field's own.
    kinds = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    for kind in kinds:
        args = get_args(kind)
        origin = get_origin(kind)
        if origin is list and isinstance(value, list) and args and _is_number(args[0]):
            return value
        if origin is dict and isinstance(value, dict) and len(args) == 2 and _is_number(args[1]):
            return list(value.values())
    return []


def no_nul_byte(value: str | None, what: str) -> str | None:
    """``value`` unless it holds a NUL byte, which no OS path or URL can carry."""
    if value is not None and "\x00" in value:
        raise ValueError(f"must be {what} without a NUL byte")
    return value


# The longest name a file system takes for one file or directory (NAME_MAX).
NAME_MAX = 255


def usable_path(value: str | None) -> str | None:
    """A path setting that the OS can take: no NUL byte, no name over NAME_MAX bytes,
    no ``~user`` of an unknown user."""
    if value is None:
        return value
    no_nul_byte(value, "a path")
    # surrogatepass: a lone surrogate counts its bytes here instead of raising.
    if any(len(part.encode(errors="surrogatepass")) > NAME_MAX for part in Path(value).parts):
        raise ValueError(f"has a name longer than {NAME_MAX} bytes (the file system's limit)")
    try:
        Path(value).expanduser()
    except RuntimeError:
        raise ValueError("names the home directory of an unknown user (~user)") from None
    return value


def scheduler_address_problem(address: str) -> str | None:
    """What is wrong with a Dask scheduler address, or None if it looks like one.

    Syntax only (scheme, host, port); whether a scheduler answers there is
    another matter.
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(address if "://" in address else f"tcp://{address}")
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("tcp", "tls", "ws", "wss") or not parts.hostname or not port:
        return "expected an address such as tcp://127.0.0.1:8786"
    return None


def no_url_secrets(url: str | None, instead: str) -> str | None:
    """``url`` if it carries no credentials; else a one-line error naming where (not what)."""
    if url:
        found = url_secrets(url)
        if found:
            raise ValueError(
                f"must not contain credentials ({', '.join(found)}): the config is recorded in "
                f"the ledger and shown in Prefect; {instead}"
            )
    return url

"""Secrets: finding credentials in configs and URLs, and hiding them in what is shown.

A run's config is recorded in the ledger and shown as Prefect parameters, so
it must hold no secret (docs/design.md §7). :func:`secret_keys` finds
credential-like keys at any depth of a mapping (``store.storage_options``),
:func:`url_secrets` the credentials in a URL (a password in its user info, a
query parameter such as ``password=``, ``token=`` or ``key=``). Both name
where a secret is, never its value.

:func:`redact_url` is the one way a URL is shown (messages, logs, status,
artifacts): its password and the values of its secret-looking query
parameters become ``***``. A URL that cannot be parsed is shown as its
scheme only. :func:`redact_value` masks a whole JSON-like value (what
Prefect stores of a flow's parameters).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlsplit

MASK = "***"

# Key names that hold credentials, after lowering and turning "-" into "_":
# any name with password, secret, token or credential in it (sslpassword,
# aws_secret_access_key, session_token, client_secret), and names that are or
# end in key, pwd, signature, auth, ... (key, api_key, account_key, x_amz_signature).
_SECRET_NAME = re.compile(
    r"password|passwd|secret|token|credential"
    r"|(^|_)(key|apikey|pwd|pass|sig|signature|auth|authorization|cookie|sas)$"
    r"|^(connection_string|private_key)$"
)


def is_secret_name(name: object) -> bool:
    """True if a key or query parameter of this name holds a credential."""
    if not isinstance(name, str):
        return False
    return _SECRET_NAME.search(name.strip().lower().replace("-", "_")) is not None


def secret_keys(value: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the credential-like keys anywhere in ``value`` (mappings, lists).

    A string value that is a URL with credentials counts too (an
    ``endpoint_url`` with a password in it).
    """
    return sorted(_walk(value, prefix))


def _walk(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if is_secret_name(k):
                yield here
            else:
                yield from _walk(v, here)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    elif isinstance(value, str) and "://" in value and url_secrets(value):
        yield path or "value"


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like ``value`` with every credential masked.

    The value of a credential-like key (at any depth of mappings and lists)
    becomes ``***``; a string holding URLs is passed through
    :func:`redact_text`. Anything else is returned as it is.
    """
    if isinstance(value, Mapping):
        return {
            k: MASK if is_secret_name(k) and v is not None else redact_value(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return redact_text(value)
    return value


def _split(url: str) -> Any:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        return None
    return parts


def url_secrets(url: str) -> list[str]:
    """Where ``url`` carries credentials: ``"password"`` (user info), ``"query parameter X"``.

    A URL that cannot be parsed counts as ``"unparseable URL"``: it cannot be
    checked, so it is refused rather than stored.
    """
    parts = _split(url)
    if parts is None:
        return ["unparseable URL"]
    found = []
    if parts.password is not None:
        found.append("password")
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if is_secret_name(name):
            found.append(f"query parameter {name!r}")
    if parts.fragment and "=" in parts.fragment:
        for name, _ in parse_qsl(parts.fragment, keep_blank_values=True):
            if is_secret_name(name):
                found.append(f"fragment parameter {name!r}")
    return found


def redact_url(url: object) -> str:
    """``url`` as it may be shown: password and secret query values replaced by ``***``.

    Edits the text in place (rather than parsing and joining it again), so that
    everything else is shown exactly as given (``sqlite:////abs/path`` keeps
    its slashes).
    """
    text = str(url)
    if _split(text) is None:
        scheme = text.split("://", 1)[0] if "://" in text else ""
        return f"<unparseable {scheme} URL>" if scheme.isidentifier() else "<unparseable URL>"
    head, sep, rest = text.partition("://")
    if not sep:
        head, rest = "", text
    else:
        head += sep
        end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
        netloc, rest = rest[:end], rest[end:]
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user, colon, _password = userinfo.partition(":")
            # The user name stays (it says who connects); a password never does.
            netloc = f"{user}:{MASK}@{host}" if colon else f"{user}@{host}"
        head += netloc
    return head + re.sub(r"([?&#;])([^=&#;]*)=([^&#;]*)", _mask_pair, rest)


def _mask_pair(m: re.Match[str]) -> str:
    name = unquote_plus(m.group(2))
    return f"{m.group(1)}{m.group(2)}={MASK}" if is_secret_name(name) else m.group(0)


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def redact_text(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url` (messages, events)."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)

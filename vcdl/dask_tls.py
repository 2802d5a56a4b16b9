"""Whether the driver's Dask TLS settings can be used, asked before a ``tls://`` connection.

vcdl adds no TLS settings of its own for Dask: the driver's client takes
Dask's (``distributed.comm.tls.ca-file``, ``distributed.comm.tls.client.cert``
and ``.key``, from ``DASK_DISTRIBUTED__COMM__TLS__CA_FILE`` and its siblings
or a Dask YAML file), the ones ``dask scheduler`` and ``dask worker`` take as
``--tls-ca-file``, ``--tls-cert`` and ``--tls-key``. They stay out of the run
config, so no path or key is recorded in the ledger or shown in Prefect.

Dask reads these files only when it connects, and a missing one was a
traceback from deep in the ``ssl`` module after the run was recorded.
:func:`client_tls_problem` says in one line which setting is missing, which
file cannot be read, or that the certificate and key do not load.
"""

from __future__ import annotations

import os
import ssl

# Each Dask setting the client reads, and the environment variable that sets it.
_SETTINGS = {
    "distributed.comm.tls.ca-file": "DASK_DISTRIBUTED__COMM__TLS__CA_FILE",
    "distributed.comm.tls.client.cert": "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
    "distributed.comm.tls.client.key": "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY",
}
_NEEDED = ("distributed.comm.tls.ca-file", "distributed.comm.tls.client.cert")


def _unreadable(path: str) -> str | None:
    """Why ``path`` is not a file this process can read, or None."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except IsADirectoryError:
        return "is a directory"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def client_tls_problem(address: str) -> str | None:
    """What keeps the driver's Dask client from connecting to ``address``, or None.

    For a ``tls://`` (or ``wss://``) address: the CA file and the client certificate must be
    set (the key may be in the certificate's file, as Dask allows), each
    named file readable, and together loadable as a certificate chain. For a
    ``tcp://`` or ``ws://`` address while ``distributed.comm.require-encryption``
    is on: the address. Whether the scheduler accepts the certificate is the TLS
    handshake's to say.
    """
    import dask

    scheme = address.split("://", 1)[0].lower() if "://" in address else "tcp"
    if scheme not in ("tls", "wss"):  # wss: Dask's websockets take the same settings
        if dask.config.get("distributed.comm.require-encryption", None):
            return (
                f"distributed.comm.require-encryption is on but {address[:200]} is a {scheme}:// "
                "address: use the scheduler's tls:// address"
            )
        return None
    values = {key: dask.config.get(key, None) for key in _SETTINGS}
    for key in _NEEDED:
        if not values[key]:
            return (
                f"{address[:200]} is a {scheme}:// address but Dask's {key} is not set: set "
                f"{_SETTINGS[key]} (or {key} in a Dask config file) to a PEM file"
            )
    if any("\n" in str(v) for v in values.values() if v):
        # PEM text itself, as Dask also takes (Security.temporary's): no files to read.
        return None
    for key, path in values.items():
        if path:
            why = _unreadable(os.path.expanduser(str(path)))
            if why:
                return f"Dask's {key} {str(path)[:200]} cannot be read: {why}"
    cert = str(values["distributed.comm.tls.client.cert"])
    key = values["distributed.comm.tls.client.key"]
    try:
        context = ssl.create_default_context(cafile=str(values["distributed.comm.tls.ca-file"]))
        # A callback, so that an encrypted key fails here instead of OpenSSL
        # prompting on the terminal: Dask's client cannot be given a passphrase.
        context.load_cert_chain(cert, str(key) if key else None, password=_no_passphrase)
    except _Encrypted:
        return (
            "Dask's distributed.comm.tls.client key is encrypted: Dask cannot be given its "
            "passphrase; give it an unencrypted key file readable by this user only"
        )
    except (ssl.SSLError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:200]
        return (
            "Dask's TLS files do not load as a CA and a client certificate with its key "
            f"(distributed.comm.tls.ca-file, .client.cert, .client.key): {detail}"
        )
    return None


class _Encrypted(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _Encrypted


def handshake_refused(address: str, exc: BaseException) -> str | None:
    """One line for a TLS handshake with the scheduler at ``address`` that failed, else None.

    Dask reports it as a ``CommClosedError`` (fatal or not, as the alert
    or the closed socket arrived first) naming the comm and the SSL error,
    or, once its connect retries ran out, as a timeout caused by one: it read
    as "no Dask scheduler answered". The exception and its causes are searched.
    """
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        text = " ".join(str(seen).split())
        if isinstance(seen, ssl.SSLError) or "SSLError" in text or "SSLEOFError" in text:
            detail = text.rsplit(">: ", 1)[-1][:300]
            return (
                f"the TLS handshake with the Dask scheduler at {address[:200]} failed ({detail}): "
                "the CA in distributed.comm.tls.ca-file must have signed both the scheduler's "
                "certificate and this client's (distributed.comm.tls.client.cert)"
            )
        seen = seen.__cause__ or seen.__context__
    return None

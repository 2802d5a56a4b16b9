"""A throwaway PostgreSQL server taking only TLS connections with a password, for a test module.

The machine's own server (127.0.0.1:5432, the suite's ``pg_url``) may have
SSL off and is shared: it is never reconfigured. This one is made from the
installed ``initdb``/``postgres`` binaries in a folder under /tmp owned by
the ``postgres`` user (the server refuses to run as root), listens on a free
loopback port with ``ssl = on`` and the test's certificate, and its
``pg_hba.conf`` has one line, ``hostssl ... scram-sha-256``: a connection
without TLS, or without the password, is refused. It is stopped and its
folder removed afterwards; the server dies with the test process too
(``PR_SET_PDEATHSIG``).

Where the binaries or the ``postgres`` user are missing, :func:`pg_binaries`
says why, and the test skips (fails under ``CI=true``).
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port
from tests.tlscerts import Leaf

__all__ = ["SslPostgres", "pg_binaries", "ssl_postgres"]

USER = "postgres"


@dataclass(frozen=True)
class SslPostgres:
    """Where the server listens, and a URL for it (no password: that is PGPASSWORD's)."""

    host: str
    port: int

    def url(self, ca: Path, sslmode: str = "verify-full", host: str | None = None) -> str:
        return (
            f"postgresql+psycopg://{USER}@{host or self.host}:{self.port}/postgres"
            f"?sslmode={sslmode}&sslrootcert={ca}"
        )


def pg_binaries() -> tuple[Path | None, str]:
    """The folder of ``initdb`` and ``postgres``, or None and why not."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return None, f"no {USER!r} user to run a PostgreSQL server as"
    if os.geteuid() != 0:
        return None, "only root can start a server as the postgres user"
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    for initdb in reversed(found):
        if (initdb.parent / "postgres").is_file():
            return initdb.parent, ""
    on_path = shutil.which("initdb"), shutil.which("postgres")
    if all(on_path):
        return Path(str(on_path[0])).parent, ""
    return None, "no initdb and postgres binaries (/usr/lib/postgresql/*/bin or PATH)"


def pg_binaries_or_skip() -> Path:
    """:func:`pg_binaries`' folder; the test skips without it, and fails under CI=true
    (where the TLS tests must run)."""
    import pytest

    bindir, why = pg_binaries()
    if bindir is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why} (CI=true: the TLS tests must run)", pytrace=False)
        pytest.skip(why)
    return bindir


def _as_postgres() -> None:
    # Runs in the child between fork and exec: become postgres, then ask to
    # be killed with the test process (set after the uid change, which clears it).
    entry = pwd.getpwnam(USER)
    os.setgid(entry.pw_gid)
    os.initgroups(USER, entry.pw_gid)
    os.setuid(entry.pw_uid)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _own(path: Path) -> None:
    entry = pwd.getpwnam(USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _wait_ready(url_kwargs: dict[str, object], proc: subprocess.Popen[bytes], log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        try:
            psycopg.connect(**url_kwargs, connect_timeout=3).close()  # type: ignore[call-overload]
            return
        except psycopg.OperationalError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL did not start: {exc}; {log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.2)


@contextmanager
def ssl_postgres(bindir: Path, server: Leaf, ca: Path, password: str) -> Iterator[SslPostgres]:
    """A running server whose superuser ``postgres`` has ``password``; TLS with ``server``."""
    root = Path(tempfile.mkdtemp(prefix="vcdl-pgssl-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        _own(root)
        data, pwfile, log = root / "data", root / "pw", root / "server.log"
        pwfile.write_text(password + "\n")
        pwfile.chmod(0o600)
        _own(pwfile)
        subprocess.run(
            [
                bindir / "initdb",
                "-D",
                data,
                "-U",
                USER,
                "--pwfile",
                pwfile,
                "-A",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            preexec_fn=_as_postgres,
            check=True,
            capture_output=True,
            timeout=120,
        )
        pwfile.unlink()
        for name, source in (("server.crt", server.cert), ("server.key", server.key)):
            shutil.copy(source, data / name)
            (data / name).chmod(0o600)
            _own(data / name)
        port = free_port()
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {port}\n"
                "unix_socket_directories = ''\nssl = on\n"
                "ssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            )
        (data / "pg_hba.conf").write_text("hostssl all all 127.0.0.1/32 scram-sha-256\n")
        log.touch()
        _own(log)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [bindir / "postgres", "-D", data],
                preexec_fn=_as_postgres,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        _wait_ready(
            {
                "host": "127.0.0.1",
                "port": port,
                "user": USER,
                "dbname": "postgres",
                "password": password,
                # verify-ca: up on loopback, whatever address the certificate names.
                "sslmode": "verify-ca",
                "sslrootcert": str(ca),
            },
            proc,
            log,
        )
        yield SslPostgres("127.0.0.1", port)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: sessions ended, no wait
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)

"""The per-worker probe of ``vcdl fleet check``: what one Dask worker reaches and runs.

This module owns what runs on a worker. The driver sends :func:`probe` to
every worker with ``client.run`` and a plain dict (:func:`vcdl.fleetcheck.gather.probe_spec`);
it answers a plain dict, the worker's part of a report (docs/spot-fleet.md,
"Checking a fleet"). It raises nothing a check can cause: each failure is a
sentence in the part it concerns.

- **Scheduler**: the address the worker itself uses, and whether it is TLS.
- **Store**: a write, read and delete of one small object under
  ``fleet-check/`` in the run's store, never under ``runs/``: a worker's job
  is writing results and checkpoints, so a read-only probe would pass a
  worker whose credentials can only read. A local store is probed only
  where its directory already exists (nothing is made on a worker's disk).
- **Ledger**: one connection and reads only (the schema's revision; on
  PostgreSQL whether the connection is encrypted, from ``pg_stat_ssl``); an
  SQLite file is opened read-only. Nothing is written to any run.
- **Versions**: vcdl and Python here; torch, the device and the run's code
  in a child process (:mod:`vcdl.fleetcheck.environment`), so that importing
  user code or initialising CUDA never touches the worker process itself.

Each part has its own deadline (``part_timeout``): a cut link to the store
is reported as the store not answering, not as a worker that never answered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The store prefix the probe writes under (outside every run's ``runs/NAME``).
PROBE_PREFIX = "fleet-check"


def now() -> float:
    """This worker's wall clock: a clock sample's middle (:mod:`vcdl.fleetcheck.clock`)."""
    return time.time()


async def probe(spec: dict[str, Any], dask_worker: Any = None) -> dict[str, Any]:
    """The worker's report (see the module); ``dask_worker`` is given by ``client.run``.

    A coroutine, so that ``client.run`` awaits it on the worker's event loop
    while the blocking parts run in threads: a slow store must not stall the
    worker's heartbeats.
    """
    started = time.monotonic()
    budget = float(spec.get("part_timeout", 20.0))
    store, ledger, environment = await asyncio.gather(
        _bounded(check_store, spec.get("store"), budget, "the store"),
        _bounded(check_ledger, spec.get("ledger"), budget, "the ledger"),
        _bounded(check_environment, spec.get("code"), budget, "the environment check"),
    )
    address = getattr(getattr(dask_worker, "scheduler", None), "address", None)
    return {
        "scheduler": {"reached": True, "address": address, "tls": _is_tls(address)},
        "store": store,
        "ledger": ledger,
        "versions": {
            "vcdl": _vcdl_version(),
            "torch": (environment or {}).get("torch"),
            "python": platform.python_version(),
        },
        "code": (environment or {}).get("code"),
        "device": (environment or {}).get("device"),
        "environment_error": (environment or {}).get("error"),
        "seconds": round(time.monotonic() - started, 3),
    }


async def _bounded(
    check: Callable[[Any], dict[str, Any]], part: Any, seconds: float, what: str
) -> dict[str, Any] | None:
    """``check(part)`` in a thread, or a failure saying it took too long; None if not asked."""
    if part is None:
        return None
    try:
        return await asyncio.wait_for(asyncio.to_thread(check, part), seconds)
    except TimeoutError:
        # The thread goes on until its own socket timeouts end it; the answer is now.
        return {"ok": False, "error": f"no answer from {what} within {seconds:.0f} s"}
    except Exception as exc:  # a bug in a check must still give a report
        return {"ok": False, "error": f"{type(exc).__name__}: {_short(exc)}"}


def _is_tls(address: str | None) -> bool | None:
    if not address or "://" not in address:
        return None
    return address.split("://", 1)[0] in ("tls", "wss")


def _vcdl_version() -> str:
    import vcdl

    return str(vcdl.__version__)


def _short(exc: BaseException, most: int = 300) -> str:
    from vcdl.redact import redact_text

    text = " ".join(redact_text(str(exc)).split())
    return text if len(text) <= most else text[: most - 3] + "..."


# -- the store ----------------------------------------------------------------


def store_tls(url: str, options: dict[str, Any]) -> bool | None:
    """Whether the store is reached over TLS: its endpoint's scheme; None for a local store."""
    if "://" not in url or url.startswith("file://"):
        return None
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get(
        "endpoint_url"
    )
    if endpoint:
        return str(endpoint).lower().startswith("https://")
    return True  # s3fs, gcsfs, adlfs: their clouds' default endpoints are HTTPS


def check_store(store: dict[str, Any]) -> dict[str, Any]:
    """Write, read back and delete one small object under :data:`PROBE_PREFIX`."""
    from zarr.core.buffer import default_buffer_prototype

    from vcdl.store.backend import Backend

    url, options = str(store["url"]), dict(store.get("storage_options") or {})
    out: dict[str, Any] = {"ok": False, "tls": store_tls(url, options), "error": None}
    local = "://" not in url or url.startswith("file://")
    if local and not os.path.isdir(os.path.expanduser(url.removeprefix("file://"))):
        out["error"] = (
            f"no directory {url} on this worker: a local store must be a disk "
            "every worker mounts (or use s3://)"
        )
        return out
    started = time.monotonic()
    try:
        backend = Backend(url, options)
        key = f"{PROBE_PREFIX}/{uuid.uuid4().hex}"
        payload = f"vcdl fleet check {key}".encode()
        buffers = default_buffer_prototype()

        async def round_trip() -> bytes | None:
            await backend.check_bucket()
            await backend.store.set(key, buffers.buffer.from_bytes(payload))
            try:
                got = await backend.store.get(key, prototype=buffers)
            finally:
                await backend.store.delete(key)
            return None if got is None else got.to_bytes()

        got = backend.run(round_trip(), "probing", backend.shown(key))
    except Exception as exc:
        out["error"] = _short(exc)
        return out
    finally:
        if local:
            # A local store keeps the emptied folder; an object store has none.
            _remove_empty(Path(url.removeprefix("file://")).expanduser() / PROBE_PREFIX)
    out["seconds"] = round(time.monotonic() - started, 3)
    if got != payload:
        out["error"] = "what was written could not be read back intact"
        return out
    out["ok"] = True
    return out


def _remove_empty(folder: Path) -> None:
    # Gone already, or another worker's probe is in it: either is fine.
    with contextlib.suppress(OSError):
        folder.rmdir()


# -- the ledger -----------------------------------------------------------------


def check_ledger(ledger: dict[str, Any]) -> dict[str, Any]:
    """Connect to the ledger and read its schema revision; nothing is written."""
    url = str(ledger["url"])
    out: dict[str, Any] = {"ok": False, "tls": None, "revision": None, "error": None}
    started = time.monotonic()
    try:
        if url.startswith("sqlite"):
            out["revision"] = _sqlite_revision(url)
        else:
            out["revision"], out["tls"] = _server_revision(url)
    except Exception as exc:
        out["error"] = _short(exc)
        return out
    out["seconds"] = round(time.monotonic() - started, 3)
    out["ok"] = True
    return out


def _sqlite_revision(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    db = make_url(url).database
    if not db or db == ":memory:":
        raise ValueError("an in-memory SQLite ledger is no worker's to reach")
    path = Path(db).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"no ledger file {path} on this worker: an SQLite ledger reaches only the "
            "machine it is on (use PostgreSQL for a fleet)"
        )
    # mode=ro: the file is read, never written (not even switched to WAL).
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "alembic_version" not in names:
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return None if row is None else str(row[0])


def _server_revision(url: str) -> tuple[str | None, bool | None]:
    from vcdl.ledger.engine import LedgerEngine
    from vcdl.ledger.migrations import current_revision

    engine = LedgerEngine(url, create=False)
    try:
        with engine.read_engine.connect() as conn:
            revision = current_revision(conn)
            tls: bool | None = None
            if engine.backend == "postgresql":
                row = conn.exec_driver_sql(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                ).fetchone()
                tls = None if row is None else bool(row[0])
        return revision, tls
    except Exception as exc:
        raise engine.error(exc, "cannot reach ledger") from None
    finally:
        engine.dispose()


# -- torch, the device, the run's code: in a child process ---------------------


def check_environment(code: dict[str, Any]) -> dict[str, Any]:
    """Run :mod:`vcdl.fleetcheck.environment` in a child process; what it printed.

    The child gets this worker's ``sys.path`` (with what plugins put on it,
    as the run's tasks would) behind the run's own modules, which the
    driver sent as a zip archive, exactly what ``flows/cluster.py`` ships.
    """
    seconds = float(code.get("timeout", 20.0))
    with tempfile.TemporaryDirectory(prefix="vcdl-fleet-check-") as tmp:
        paths = [p for p in sys.path if p]
        archive = code.get("archive")
        if archive:
            zipped = Path(tmp) / "code.zip"
            zipped.write_bytes(base64.b64decode(archive))
            paths.insert(0, str(zipped))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        request = json.dumps({"specs": code.get("specs", []), "grants": code.get("grants", [])})
        try:
            done = subprocess.run(
                [sys.executable, "-m", "vcdl.fleetcheck.environment"],
                input=request,
                capture_output=True,
                text=True,
                timeout=seconds,
                cwd=tmp,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"importing torch and the run's code took over {seconds:.0f} s"}
    lines = done.stdout.strip().splitlines()
    try:
        answer: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " ".join(done.stderr.split())[-300:]
        return {"error": f"the environment check exited {done.returncode}: {tail or 'no output'}"}
    return answer

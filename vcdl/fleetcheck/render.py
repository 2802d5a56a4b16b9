"""``vcdl fleet check``'s output: its JSON document and its text, from a verdict. Pure.

:func:`document` is the ``--json`` document (its keys are listed in
docs/spot-fleet.md, "Checking a fleet"; keys may be added, none renamed or
removed without a note there); :func:`text` is one line per worker, then
the verdict's line, built from that same document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vcdl.fleetcheck.verdict import Needs
from vcdl.redact import redact_url

#: Keys of a worker's object in the document, in order.
WORKER_KEYS = (
    "name",
    "address",
    "host",
    "ok",
    "problems",
    "answered",
    "error",
    "scheduler",
    "store",
    "ledger",
    "clock",
    "versions",
    "code",
    "device",
    "seconds",
)


def document(
    address: str,
    driver: Mapping[str, Any],
    spec: Mapping[str, Any],
    verdict: Mapping[str, Any],
    needs: Needs,
    timeout: float,
) -> dict[str, Any]:
    """The ``--json`` document (see the module)."""
    store = spec.get("store")
    ledger = spec.get("ledger")
    code = spec.get("code") or {}
    configured = store is not None  # a run's config was given: store, ledger, code checked
    return {
        "ok": bool(verdict["ok"]),
        "problems": list(verdict["problems"]),
        "scheduler": {"address": address, "tls": address.startswith(("tls://", "wss://"))},
        "driver": dict(driver),
        "checked": {
            "store": redact_url(store["url"]) if store else None,
            "store_probe": "write-read-delete" if store else None,
            "ledger": redact_url(ledger["url"]) if ledger else None,
            "code": list(code.get("specs") or []) if configured else None,
            "cuda": needs.cuda,
            "max_skew_s": needs.max_skew,
            "timeout_s": timeout,
        },
        "workers": [{k: w.get(k) for k in WORKER_KEYS} for w in verdict["workers"]],
    }


def _tls(flag: object) -> str:
    return "TLS" if flag is True else "no TLS" if flag is False else "local"


def _part(name: str, result: Mapping[str, Any] | None) -> str:
    if result is None:
        return f"{name} -"
    if not result.get("ok"):
        return f"{name} FAILED"
    seconds = result.get("seconds")
    took = f" {seconds:.2f}s" if isinstance(seconds, int | float) else ""
    return f"{name} ok{took} ({_tls(result.get('tls'))})"


def _gib(size: object) -> str:
    return f"{size / 2**30:.1f} GiB" if isinstance(size, int | float) else "? GiB"


def worker_line(worker: Mapping[str, Any]) -> str:
    """One worker: verdict, name, address, each check, and its problems after a dash."""
    head = f"{'ok  ' if worker.get('ok') else 'FAIL'} {worker.get('name')} {worker.get('address')}"
    if not worker.get("answered"):
        return f"{head} — {'; '.join(worker.get('problems') or [])}"
    sched = worker.get("scheduler") or {}
    clock = worker.get("clock")
    versions = worker.get("versions") or {}
    code = worker.get("code") or {}
    device = worker.get("device") or {}
    parts = [
        f"scheduler {_tls(sched.get('tls'))}",
        _part("store", worker.get("store")),
        _part("ledger", worker.get("ledger")),
        f"clock {clock['skew_s']:+.3f}±{clock['bound_s']:.3f}s" if clock else "clock ?",
        f"vcdl {versions.get('vcdl')} torch {versions.get('torch')} "
        f"python {versions.get('python')}",
        "code -" if not code.get("specs") else "code ok" if code.get("ok") else "code FAILED",
        f"{device.get('name', '?')} {_gib(device.get('memory_bytes'))}",
    ]
    line = f"{head}: {' · '.join(parts)}"
    problems = worker.get("problems") or []
    return f"{line} — {'; '.join(problems)}" if problems else line


def _lacks(worker: Mapping[str, Any]) -> str:
    kinds = [p.split(":", 1)[0] for p in worker.get("problems") or []]
    return f"{worker.get('name')} ({', '.join(dict.fromkeys(kinds))})"


def verdict_line(doc: Mapping[str, Any]) -> str:
    """The last line: whether every worker can do the run's job, else who cannot and why."""
    workers = doc["workers"]
    where = f"scheduler {doc['scheduler']['address']}"
    if doc["problems"]:
        return f"fleet check: FAILED: {'; '.join(doc['problems'])} ({where})"
    bad = [w for w in workers if not w["ok"]]
    if not bad:
        return f"fleet check: ok: all {len(workers)} worker(s) can do the run's job ({where})"
    return (
        f"fleet check: FAILED: {len(bad)} of {len(workers)} worker(s) cannot do the run's job: "
        f"{'; '.join(_lacks(w) for w in bad)} ({where})"
    )


def text(doc: Mapping[str, Any]) -> str:
    """One line per worker, then the verdict's line."""
    return "\n".join([*(worker_line(w) for w in doc["workers"]), verdict_line(doc)])

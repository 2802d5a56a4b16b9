"""The child process of a worker's probe: torch, the device, and the run's code.

This module owns what ``vcdl fleet check`` learns by importing things on a
worker: torch's version, the device an attempt would train on, and whether
the run's import paths (model factory, objective, metrics) import and name
callables. It runs as ``python -m vcdl.fleetcheck.environment`` in a child
of the worker (:func:`vcdl.fleetcheck.probe.check_environment`), reading one
JSON request on stdin (``specs``: the import paths, ``grants``: the modules
the driver allowed) and printing one JSON answer as its last line: user code
that prints, exits or crashes at import, and CUDA's initialisation, stay out
of the worker process.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def device() -> dict[str, Any]:
    """The device an attempt would use under ``train.device = "auto"``: kind, name, memory."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return {
            "kind": "cuda",
            "name": str(props.name),
            "count": int(torch.cuda.device_count()),
            "memory_bytes": int(props.total_memory),
        }
    try:
        memory: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"kind": "cpu", "name": "cpu", "count": os.cpu_count() or 1, "memory_bytes": memory}


def import_code(specs: list[str], grants: list[str]) -> dict[str, Any]:
    """Import each of the run's import paths as a worker's attempt would; the first failure."""
    from vcdl.errors import VcdlError
    from vcdl.models.factory import BUILTIN_MODELS
    from vcdl.usercode import grant, import_callable

    grant(grants)  # what the driver allowed, as its ImportAllowance plugin would
    for spec in specs:
        try:
            import_callable(spec, what="run code", builtins=BUILTIN_MODELS, error=VcdlError)
        except VcdlError as exc:
            return {"ok": False, "specs": specs, "error": " ".join(str(exc).split())[:400]}
    return {"ok": True, "specs": specs, "error": None}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request (see the module)."""
    out: dict[str, Any] = {"torch": None, "device": None, "code": None, "error": None}
    try:
        import torch

        out["torch"] = str(torch.__version__)
        out["device"] = device()
    except Exception as exc:  # a broken torch install is this worker's problem to report
        out["error"] = f"torch: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    out["code"] = import_code(list(request.get("specs") or []), list(request.get("grants") or []))
    return out


def main() -> None:
    request = json.loads(sys.stdin.read() or "{}")
    result = answer(request)
    # The last line is the answer, whatever the user's code printed before it.
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

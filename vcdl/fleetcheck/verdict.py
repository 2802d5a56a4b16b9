"""Whether each worker can do a run's job, from the reports the probes gave: pure.

This module owns the rules of ``vcdl fleet check``'s verdict. A worker
report is the dict :mod:`vcdl.fleetcheck.gather` assembles (the probe's
answer, its address and name, its clock); :func:`judge` adds ``ok`` and
``problems`` (short sentences, each ``"what: why"``) to each
and says whether the whole fleet can train. A worker cannot do its job when:

- it did not answer the probe in time (or the probe failed on it);
- a store or ledger the run names did not pass its probe there;
- its vcdl or torch version differs from the driver's, or its Python's
  major.minor does (what pickles and tensors cross between them);
- the run's code does not import there;
- the run asks for CUDA (``train.device = "cuda"``) and it has none;
- its clock is surely (beyond the round trip's bound) more than
  ``max_skew`` seconds off the driver's: attempt times it writes to the
  ledger are read against the driver's clock (story, phases, cost).

A fleet with no worker at all cannot train either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vcdl.fleetcheck.clock import Skew, surely_over


@dataclass(frozen=True)
class Needs:
    """What the run asks of every worker; a part left out of the config is not checked."""

    store: bool = False
    ledger: bool = False
    code: bool = False
    cuda: bool = False
    #: Seconds a worker's clock may be off the driver's.
    max_skew: float = 5.0


def _minor(version: object) -> str | None:
    if not isinstance(version, str):
        return None
    return ".".join(version.split(".")[:2])


def version_problems(worker: Mapping[str, Any], driver: Mapping[str, Any]) -> list[str]:
    """The worker's versions that differ from the driver's (see the module)."""
    problems = []
    for name in ("vcdl", "torch"):
        have, want = worker.get(name), driver.get(name)
        if have is None:
            problems.append(f"{name}: not importable")
        elif have != want:
            problems.append(f"{name}: {have}, the driver's {want}")
    if _minor(worker.get("python")) != _minor(driver.get("python")):
        problems.append(f"python: {worker.get('python')}, the driver's {driver.get('python')}")
    return problems


def worker_problems(
    report: Mapping[str, Any], driver: Mapping[str, Any], needs: Needs
) -> list[str]:
    """What keeps one worker from doing the run's job; empty when nothing does."""
    if not report.get("answered"):
        return [f"no answer: {report.get('error') or 'the probe did not return'}"]
    problems: list[str] = []
    for part, needed in (("store", needs.store), ("ledger", needs.ledger)):
        result = report.get(part)
        if needed and not (result or {}).get("ok"):
            problems.append(f"{part}: {(result or {}).get('error') or 'not probed'}")
    versions = dict(report.get("versions") or {})
    problems += version_problems(versions, driver)
    if report.get("environment_error"):
        problems.append(str(report["environment_error"]))
    code = report.get("code") or {}
    if needs.code and not code.get("ok"):
        problems.append(f"code: {code.get('error') or 'not checked'}")
    device = report.get("device") or {}
    if needs.cuda and device.get("kind") != "cuda":
        problems.append("device: no CUDA device, and the run sets train.device = 'cuda'")
    skew: Skew | None = report.get("clock")
    if skew is not None and surely_over(skew, needs.max_skew):
        problems.append(
            f"clock: {skew['skew_s']:+.2f} s off the driver's (± {skew['bound_s']:.3f} s; "
            f"at most {needs.max_skew:g} s allowed)"
        )
    return problems


def judge(
    reports: Sequence[Mapping[str, Any]], driver: Mapping[str, Any], needs: Needs
) -> dict[str, Any]:
    """``{"ok", "problems", "workers"}``: each report with its ``ok`` and ``problems``."""
    workers = []
    for report in reports:
        problems = worker_problems(report, driver, needs)
        workers.append({**report, "ok": not problems, "problems": problems})
    fleet = [] if workers else ["the scheduler has no workers"]
    ok = not fleet and all(w["ok"] for w in workers)
    return {"ok": ok, "problems": fleet, "workers": workers}

"""The projection of `benchmarks/fleet.py`: workers one driver machine serves."""

from __future__ import annotations

from benchmarks.fleet import projection


def _run(driver: float, api: float, merge: float) -> dict[str, object]:
    return {
        "driver_cpu_s_per_attempt": driver,
        "api_cpu_s_per_attempt": api,
        "phases": {"train": 30.0, "assimilator_merge": merge, "assimilator_ledger": 0.0},
    }


def test_the_cores_cap_attempts_per_second() -> None:
    # 0.1 CPU-s an attempt on 2 cores: 20 attempts a second; 30-s attempts: 600 workers.
    p = projection(_run(0.06, 0.04, 0.01), 30.0, 2)
    assert p["workers_by_cpu"] == 600 and p["workers_by_merge"] == 3000
    assert p["max_workers"] == 600


def test_the_serial_merge_caps_merges_per_second() -> None:
    # 0.4 s a merge: 2.5 merges a second, 75 workers at 30 s, whatever the cores.
    p = projection(_run(0.01, 0.01, 0.4), 30.0, 16)
    assert p["workers_by_merge"] == 75 and p["max_workers"] == 75


def test_a_run_with_no_cost_measured_projects_no_limit_from_it() -> None:
    p = projection(_run(0.0, 0.0, 0.5), 30.0, 2)
    assert p["workers_by_cpu"] is None
    assert p["max_workers"] == p["workers_by_merge"] == 60

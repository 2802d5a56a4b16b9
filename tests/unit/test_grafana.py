"""infra/grafana/vcdl.json is a Grafana dashboard model naming only metrics the driver exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from vcdl.metrics.exporter import RunCollector

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "vcdl.json"

# The PromQL this dashboard may use besides metric names.
FUNCTIONS = {"rate", "increase", "sum", "histogram_quantile", "label_values"}
KEYWORDS = {"by", "without", "and", "or", "unless"}
SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exported_names() -> set[str]:
    """Every sample name the driver's registry exposes, read from its exposition."""
    registry = CollectorRegistry()
    registry.register(RunCollector("any"))
    names = set()
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names |= {name + s for s in SUFFIXES[kind]}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: label matchers, grouping labels, ranges,
    strings and numbers removed, what remains that is not a function or keyword."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"label_values\(([^,)]+),[^)]*\)", r"\1", bare)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return words - FUNCTIONS - KEYWORDS


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows hold theirs
    return out


def test_metric_names_of_an_expression() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, phase) (rate(x_bucket{run=~"$run"}[10m])))'
    assert metric_names(expr) == {"x_bucket"}
    assert metric_names("60 * rate(a_total[5m]) / b") == {"a_total", "b"}


def test_dashboard_is_a_grafana_model() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for key in ("title", "uid", "schemaVersion", "panels", "templating", "time", "version"):
        assert key in dash, key
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 30
    panels = _panels(dash)
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for p in panels:
        assert p["type"] in {"timeseries", "stat", "gauge", "table", "row"}, p["title"]
        assert p["title"] and {"h", "w", "x", "y"} <= set(p["gridPos"]), p["title"]
        assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "run"} <= variables


def test_dashboard_names_only_metrics_the_driver_exports() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exported = exported_names()
    exprs = [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        for v in dash["templating"]["list"]
        if v["type"] == "query"
    ]
    used = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr  # every query reads some metric
        assert names <= exported, (expr, names - exported)
        used |= names
    # Every family the driver exports is on the dashboard somewhere.
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert families <= shown, families - shown

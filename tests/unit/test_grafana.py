"""The Grafana dashboard shipped with the chart reads only the operator's own metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from disagg import opmetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "disagg-operator" / "dashboards" / "disagg-operator.json"

# A metric name in PromQL: starts with disagg_, not preceded by a name character
# (so label values such as "my_disagg_x" in a matcher are not taken for metrics).
METRIC_TOKEN = re.compile(r"(?<![A-Za-z0-9_:$])(disagg_[A-Za-z0-9_:]*)")
# Text inside quotes is a label value or regex, never a metric name.
QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dash: dict) -> Iterator[dict]:
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])  # collapsed rows


def exprs(dash: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for p in all_panels(dash):
        for t in p.get("targets", []):
            if "expr" in t:
                yield p["title"], t["expr"]
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            yield f"variable {v['name']}", q


def metric_names(expr: str) -> set[str]:
    return set(METRIC_TOKEN.findall(QUOTED.sub('""', expr)))


def test_metric_token_parser() -> None:
    e = 'sum by (reason) (increase(disagg_decisions_total{namespace=~"disagg_x"}[5m])) / disagg_gpus'
    assert metric_names(e) == {"disagg_decisions_total", "disagg_gpus"}


def test_dashboard_is_valid_json_with_panels(dashboard: dict) -> None:
    assert dashboard["title"] and dashboard["uid"]
    graphs = [p for p in all_panels(dashboard) if p["type"] != "row"]
    assert len(graphs) >= 10
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in graphs:
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]


def test_template_variables(dashboard: dict) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"namespace", "deployment"} <= set(variables)
    # Every panel query is filtered by both variables.
    for where, e in exprs(dashboard):
        if where.startswith("variable"):
            continue
        assert '$namespace"' in e and '$deployment"' in e, f"{where}: {e}"


def test_every_metric_in_the_dashboard_is_exported(dashboard: dict) -> None:
    exported = set(opmetrics.EXPORTED_NAMES)
    for where, e in exprs(dashboard):
        names = metric_names(e)
        assert names, f"{where}: no disagg_ metric in {e!r}"
        unknown = names - exported
        assert not unknown, f"{where}: {sorted(unknown)} not in opmetrics.EXPORTED_NAMES"


def test_every_exported_metric_is_on_a_panel(dashboard: dict) -> None:
    used: set[str] = set()
    for where, e in exprs(dashboard):
        if not where.startswith("variable"):
            used |= metric_names(e)
    missing = set(opmetrics.EXPORTED_NAMES) - used
    assert not missing, f"exported but on no panel: {sorted(missing)}"


@pytest.mark.parametrize(
    ("title_part", "metrics"),
    [
        ("Pool size", {"disagg_pool_replicas_desired", "disagg_pool_replicas"}),
        ("ratio", {"disagg_pool_ratio"}),
        ("Arrival rate", {"disagg_stage_arrival_rate"}),
        ("L = lambda x W", {"disagg_stage_in_system", "disagg_stage_time_in_system_seconds"}),
        (
            "TTFT",
            {"disagg_predicted_ttft_seconds", "disagg_observed_ttft_seconds", "disagg_slo_ttft_seconds"},
        ),
        ("ITL", {"disagg_predicted_itl_seconds", "disagg_observed_itl_seconds", "disagg_slo_itl_seconds"}),
        ("Draining", {"disagg_pool_draining_pods"}),
        ("Decisions", {"disagg_decisions_total"}),
        ("Metric errors", {"disagg_metric_errors_total"}),
        ("GPUs vs budget", {"disagg_gpus", "disagg_gpu_budget"}),
    ],
)
def test_required_panels(dashboard: dict, title_part: str, metrics: set[str]) -> None:
    panels = [p for p in all_panels(dashboard) if title_part in p["title"]]
    assert panels, f"no panel titled like {title_part!r}"
    used = set().union(*(metric_names(t["expr"]) for p in panels for t in p["targets"]))
    assert metrics <= used, f"{title_part}: missing {sorted(metrics - used)}"

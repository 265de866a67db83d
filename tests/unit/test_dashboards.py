"""config/dashboards/*.json: Grafana's dashboard model as the import dialog takes it (the data
source an input, `${DS_PROMETHEUS}`; a `tenant` variable), every panel with a title and a query,
every query on cellscale's metric names or the recording rules, and every query valid PromQL
(`promtool check rules` parses them as recording rules). Grafana itself is not installed here:
nothing renders these dashboards."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.dashboards import dashboard_files, dashboard_queries, load
from tests.prometheus import RULES, promtool

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# what the control plane's /metrics exposes (histograms as their _bucket, _count and _sum series)
METRICS = {
    "cellscale_gpu_allocated_seconds_total",
    "cellscale_gpu_used_seconds_total",
    "cellscale_cost_dollars_total",
    "cellscale_evicted_jobs_total",
    "cellscale_gpus_allocated",
    "cellscale_gpus_capacity",
    "cellscale_pending_jobs",
    "cellscale_quota_gpus",
    "cellscale_budget_dollars",
    "cellscale_budget_spent_dollars",
    "cellscale_budget_period_seconds",
    *(
        f"{h}_{s}"
        for h in ("cellscale_admission_wait_seconds", "cellscale_controller_cycle_seconds")
        for s in ("bucket", "count", "sum")
    ),
}
RECORDED = {
    rule["record"]
    for group in yaml.safe_load(RULES.read_text())["groups"]
    for rule in group["rules"]
    if "record" in rule
}
FILES = dashboard_files()
QUERIES = dashboard_queries()


def test_the_four_dashboards_are_there():
    assert [p.name for p in FILES] == [
        "burst-spend.json",
        "desk-cost.json",
        "gpu-efficiency.json",
        "queue-pressure.json",
    ]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_model(path: Path):
    dashboard = load(path)
    assert dashboard["schemaVersion"] == 39
    assert dashboard["uid"] and dashboard["title"]
    (source,) = dashboard["__inputs"]
    assert source == source | {"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}
    (tenant,) = dashboard["templating"]["list"]
    assert tenant["name"] == "tenant" and tenant["datasource"] == DATASOURCE
    assert tenant["query"]["query"] == "label_values(cellscale_gpus_allocated, tenant)"
    assert tenant["allValue"] == ".*"  # what tests/dashboards.py substitutes


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panels(path: Path):
    panels = load(path)["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}: {ids}"
    for panel in panels:
        assert panel["title"].strip()
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == DATASOURCE, panel["title"]


@pytest.mark.parametrize(("file", "title", "expr"), QUERIES, ids=[f"{file}: {title}" for file, title, _ in QUERIES])
def test_queries_use_known_series(file: str, title: str, expr: str):
    names = set(re.findall(r"\b(?:[a-z_]+:)?cellscale_\w+(?::\w+)?", expr))
    assert names, f"{file}: {title}: no cellscale series in {expr}"
    assert names <= METRICS | RECORDED, f"{file}: {title}: unknown series {names - METRICS - RECORDED}"


def test_queries_are_valid_promql(tmp_path: Path):
    rules = [{"record": f"dashboard_query_{i}", "expr": expr} for i, (_, _, expr) in enumerate(QUERIES)]
    check = tmp_path / "dashboard-queries.yml"
    check.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = promtool("check", "rules", check)
    assert f"SUCCESS: {len(QUERIES)} rules found" in result.stdout

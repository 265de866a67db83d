"""Every query of config/dashboards/ runs on a real Prometheus (the session's `prometheus`, with
the recording rules loaded): `query` raises on anything Prometheus refuses. With no cellscale
target scraped the results are empty; this checks the queries, not the numbers."""

from __future__ import annotations

import pytest

from tests.dashboards import dashboard_queries

pytestmark = pytest.mark.integration

QUERIES = dashboard_queries()


@pytest.mark.parametrize(("file", "title", "expr"), QUERIES, ids=[f"{file}: {title}" for file, title, _ in QUERIES])
def test_query_runs(prometheus, file: str, title: str, expr: str):
    assert isinstance(prometheus.query(expr), list)

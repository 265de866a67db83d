"""The Prometheus harness (tests/prometheus.py) against tiny real exporters: prometheus_client's
own HTTP server, and its WSGI app behind a bearer-token check like the control plane's /metrics.
All three targets are added at once, so the test waits for one ~6 s target update, not three."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app, start_http_server

from tests.prometheus import PrometheusError, free_port

pytestmark = pytest.mark.integration

TOKEN = "harness-token"


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def requiring_token(app, token: str):
    """A WSGI app that answers 401 unless the request carries `Authorization: Bearer <token>`."""

    def guarded(environ, start_response):
        if environ.get("HTTP_AUTHORIZATION") != f"Bearer {token}":
            start_response("401 Unauthorized", [("Content-Type", "text/plain")])
            return [b"token required\n"]
        return app(environ, start_response)

    return guarded


def registry_with(name: str, value: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter(name, "a harness probe", ["tenant"], registry=registry).labels(tenant="desk-a").inc(value)
    return registry


@pytest.fixture
def plain_exporter() -> Iterator[str]:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry_with("harness_plain", 3))
    yield f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def guarded_exporter() -> Iterator[str]:
    app = requiring_token(make_wsgi_app(registry_with("harness_guarded", 5)), TOKEN)
    server: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/services/cellscale/metrics"
    server.shutdown()
    server.server_close()
    thread.join(5)


def value(sample: dict) -> float:
    return float(sample["value"][1])


def test_prometheus_scrapes_targets_added_after_start(prometheus, plain_exporter, guarded_exporter):
    plain = prometheus.add_target(plain_exporter)
    guarded = prometheus.add_target(guarded_exporter, token=TOKEN)
    refused = prometheus.add_target(guarded_exporter, token="a-wrong-token")

    (sample,) = prometheus.wait_for(f'harness_plain_total{{job="{plain}"}}', timeout=15)
    assert sample["metric"]["tenant"] == "desk-a"
    assert value(sample) == 3
    (sample,) = prometheus.wait_for(f'harness_guarded_total{{job="{guarded}"}}', timeout=15)
    assert value(sample) == 5
    # the same exporter with a wrong token: scraped, refused (401), so `up` is 0 and no samples
    (up,) = prometheus.wait_for(f'up{{job="{refused}"}}', timeout=15)
    assert value(up) == 0
    assert prometheus.query(f'harness_guarded_total{{job="{refused}"}}') == []


def test_query_raises_on_invalid_promql(prometheus):
    with pytest.raises(PrometheusError, match="bad_data"):
        prometheus.query("sum by (tenant) (")


def test_rules_are_loaded(prometheus):
    names = {rule["name"] for group in prometheus.rule_groups() for rule in group["rules"]}
    assert {"tenant:cellscale_gpu_efficiency:ratio_rate30m", "DeskBudgetBurnTooFast"} <= names

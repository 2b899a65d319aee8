"""Prometheus smoke test: the real server scrapes an endpoint served by the test."""

from __future__ import annotations

import time

import pytest
from textserver import serve_text


@pytest.mark.prometheus
def test_prometheus_scrapes_an_endpoint_and_answers_through_its_api(prometheus_factory):
    value = 42.5

    server = serve_text(lambda: f'# TYPE smoke_value gauge\nsmoke_value{{source="test"}} {value}\n')
    try:
        prom = prometheus_factory({"smoke": [f"127.0.0.1:{server.server_port}"]})
        deadline = time.monotonic() + 30
        result = []
        while time.monotonic() < deadline and not result:
            result = prom.query('smoke_value{source="test"}')
            time.sleep(0.5)
        assert result, "Prometheus never returned the scraped sample"
        assert float(result[0]["value"][1]) == value
        assert result[0]["metric"]["job"] == "smoke"
    finally:
        server.shutdown()

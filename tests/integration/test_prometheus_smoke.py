"""Prometheus smoke test: the real server scrapes an endpoint served by the test."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@pytest.mark.prometheus
def test_prometheus_scrapes_an_endpoint_and_answers_through_its_api(prometheus_factory):
    value = 42.5

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = f'# TYPE smoke_value gauge\nsmoke_value{{source="test"}} {value}\n'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
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

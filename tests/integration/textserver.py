"""A loopback HTTP server that answers every GET with text from a callable (a scrape target)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve_text(body: Callable[[], str]) -> ThreadingHTTPServer:
    """Serve `body()` in the Prometheus text format on 127.0.0.1 (a free port) until
    `.shutdown()`; each scrape calls `body` afresh."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = body().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

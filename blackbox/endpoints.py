"""The service's HTTP endpoints: /live, /ready (200 or 503, with a JSON report) and /metrics.

A small threaded server from the standard library; the port is BLACKBOX_HTTP_PORT (0 picks
a free one, which `Endpoints.port` then tells).
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from blackbox.health import Health
from blackbox.metrics import Metrics

log = structlog.get_logger("blackbox.endpoints")


class Endpoints:
    """Serves health and metrics on a background thread."""

    def __init__(self, host: str, port: int, health: Health, metrics: Metrics) -> None:
        handler = _handler(health, metrics)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("http_listening", port=self.port, paths=["/live", "/ready", "/metrics"])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(health: Health, metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(HTTPStatus.OK, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path in ("/ready", "/live"):
                ok = health.ready if self.path == "/ready" else health.live
                status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
                self._send(status, orjson.dumps(health.report()), "application/json")
            else:
                self._send(HTTPStatus.NOT_FOUND, b'{"error": "not found"}', "application/json")

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Requests are not logged: probes every few seconds would drown the log."""

    return Handler

"""The service's HTTP server: uvicorn serving the ASGI app of `blackbox.api.app` on a thread.

The port is BLACKBOX_HTTP_PORT (0 picks a free one, which `Endpoints.port` then tells);
the socket is bound when the server is built, so a port in use fails at start.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import structlog
import uvicorn
from fastapi import FastAPI

log = structlog.get_logger("blackbox.api.server")
STOP_SECONDS = 5.0


class Endpoints:
    """Serves `app` on a background thread."""

    def __init__(
        self, host: str, port: int, app: FastAPI, on_stop: Callable[[], None] = lambda: None
    ) -> None:
        self.socket = socket.create_server((host, port), reuse_port=False)
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.on_stop = on_stop
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        log.info("http_listening", host=self.socket.getsockname()[0], port=self.port,
                 paths=["/", "/api/v1", "/live", "/ready", "/metrics"])  # fmt: skip

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(STOP_SECONDS)
        self.socket.close()
        self.on_stop()

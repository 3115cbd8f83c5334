"""The service's HTTP server: uvicorn serving the ASGI app of `blackbox.api.app` on a thread.

The port is BLACKBOX_HTTP_PORT (0 picks a free one, which `Endpoints.port` then tells);
the socket is bound when the server is built, so a port in use fails at start. Connections
are bounded as connections.py says, their number to half the descriptors the process has
free at start, so clients alone never exhaust them. When descriptors run out all the same,
asyncio's accept loop reports each connection it could not accept, thousands a second (it
retries up to its backlog of 2,048 each time); they are logged once per LOG_EVERY_SECONDS.

The probes may have a listener of their own (BLACKBOX_PROBE_PORT): /live, /ready and
/metrics alone, under PROBE_LIMITS, so no number of API clients can starve them; a probe's
answer is written within PROBE_ANSWER_SECONDS or its connection is aborted.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import threading
from collections.abc import Callable
from typing import Any

import structlog
import uvicorn
from fastapi import FastAPI

from blackbox.api.connections import LISTEN_BACKLOG, Gate, Limits, Throttled, protocol_for

log = structlog.get_logger("blackbox.api.server")
STOP_SECONDS = 5.0
# At most one line per this many seconds for each kind of connection refused or failed.
LOG_EVERY_SECONDS = 10.0
# How asyncio's accept loop names a connection it could not accept (out of descriptors).
ACCEPT_FAILED = "socket.accept()"
DEFAULT_LIMITS = Limits()
# Every path the service's main server answers, and those of the probes' own listener.
API_PATHS = ("/", "/api/v1", "/live", "/ready", "/metrics")
PROBE_PATHS = ("/live", "/ready", "/metrics")
# The probes' listener: a kubelet and a scraper or two per pod, each quick; a slow client
# holds a connection 2 s at most, a probe's answer is written within 2 s (its health state
# is read from memory, /metrics from the registry).
PROBE_ANSWER_SECONDS = 2.0
PROBE_LIMITS = Limits(header_seconds=2.0, max_connections=64, answer_seconds=2.0,
                      per_client=32, request_seconds=PROBE_ANSWER_SECONDS)  # fmt: skip


class Endpoints:
    """Serves `app` on a background thread."""

    def __init__(  # noqa: PLR0913 - a server's address, app, limits and what it serves
        self, host: str, port: int, app: FastAPI, on_stop: Callable[[], None] = lambda: None,
        limits: Limits = DEFAULT_LIMITS, *, paths: tuple[str, ...] = API_PATHS,
    ) -> None:  # fmt: skip
        self.socket = socket.create_server((host, port), reuse_port=False)
        self.limits = _fitted(limits)
        gate = Gate(self.limits, Throttled("http_connections_refused", LOG_EVERY_SECONDS),
                    Throttled("http_answers_cut", LOG_EVERY_SECONDS),
                    heads=Throttled("http_requests_refused", LOG_EVERY_SECONDS))  # fmt: skip
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                loop="asyncio", http=protocol_for(gate), ws="none",
                                backlog=self.limits.accept_batch)  # fmt: skip
        self.server = Server(config)
        self.on_stop = on_stop
        self.paths = paths
        self.accept_failed = Throttled("http_accept_failed", LOG_EVERY_SECONDS)
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        log.info("http_listening", host=self.socket.getsockname()[0], port=self.port,
                 paths=list(self.paths),
                 max_connections=self.limits.max_connections,
                 per_client=self.limits.per_client)  # fmt: skip

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(STOP_SECONDS)
        self.close()

    def close(self) -> None:
        """Let go of the listening socket and what the app holds (never started: as stop)."""
        self.socket.close()
        self.on_stop()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        asyncio.get_running_loop().set_exception_handler(self._on_loop_error)
        await self.server.serve(sockets=[self.socket])

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and str(context.get("message")).startswith(ACCEPT_FAILED):
            self.accept_failed.note(loop, error=str(error))
        else:
            loop.default_exception_handler(context)


class Server(uvicorn.Server):
    """uvicorn's server, the kernel's queue of connections kept long: asyncio sizes it by
    the connections it accepts at once, which are few (Limits.accept_batch)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for listening in sockets or []:
            listening.listen(LISTEN_BACKLOG)


def _fitted(limits: Limits) -> Limits:
    """`limits` with the connections capped at half the descriptors free now."""
    most, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if most == resource.RLIM_INFINITY:
        return limits
    fitted = limits.within(most - _descriptors_open())
    if fitted != limits:
        log.warning("http_connections_capped", max_connections=fitted.max_connections,
                    asked=limits.max_connections, descriptor_limit=most)  # fmt: skip
    return fitted


def _descriptors_open() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: count none
        return 0

"""The probes' own listener (BLACKBOX_PROBE_PORT) on the real service and real sockets
(guarantee 4: no client holds the port): while slow readers hold every connection of the
API's port and the connections kept there for the probes, /live, /ready and /metrics answer
within 1 s on the probe port; a slow reader there is cut off at its answer deadline."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import replace

import httpx
import pytest
from fastapi import FastAPI

from blackbox.api.server import PROBE_LIMITS, Endpoints
from blackbox.dev.servers import free_port
from blackbox.errors import SettingsError
from blackbox.service import Service
from tests.integration.conftest import ServiceFactory
from tests.integration.test_api import TOKEN
from tests.integration.test_api_http_limits import SLOW_POST, Conn, _closing, _tasks
from tests.kafkatools import wait_until

CAP = 1000  # the API port's connections: its default cap
# /metrics asked 400 times at once: more answer than a slow reader's buffers take.
METRICS = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n" * 400
PROBE_SECONDS = 1.0  # a kubelet probe's default timeout
WATCH_SECONDS = 3.0  # how long the probes are asked while the API port is held


def _slow_readers(port: int, count: int, requests: bytes) -> list[Conn]:
    """`count` clients (from as many loopback addresses) that pipeline `requests` behind a
    1 KiB receive buffer and never read: each holds a connection busy with its answers."""
    return [Conn(port, requests, receive_buffer=1024, source=f"127.0.1.{1 + n % 250}")
            for n in range(count)]  # fmt: skip


def _slow_senders(port: int, count: int) -> list[Conn]:
    """`count` clients that announce a body and send one byte of it: each holds a
    connection busy with its request until the body timeout."""
    return [Conn(port, SLOW_POST, source=f"127.0.2.{1 + n % 100}") for n in range(count)]


def _answered_in_time(port: int, path: str) -> float:
    """Seconds /path took to answer 200 on a new connection to `port` (inf: it did not)."""
    started = time.monotonic()
    try:
        status = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=PROBE_SECONDS).status_code
    except httpx.HTTPError:
        return float("inf")
    return time.monotonic() - started if status == 200 else float("inf")


def test_the_probe_port_answers_while_slow_readers_hold_the_api_port(
    start_service: ServiceFactory,
) -> None:
    """With 1,000 slow clients holding every connection of the API's port (its default cap)
    busy, and slow readers of /metrics on the connections it keeps for the probes, the
    probe port answers /live, /ready and /metrics within 1 s each, all along."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_HTTP_HEADER_TIMEOUT="30",
                            BLACKBOX_HTTP_ANSWER_TIMEOUT="30", BLACKBOX_HTTP_BODY_TIMEOUT="30",
                            BLACKBOX_PROBE_PORT="0")  # fmt: skip
    assert service.probe_endpoints is not None
    probe_port = service.probe_endpoints.port  # picked by the system: no race for it
    port = _port(service)
    wait_until(lambda: _answered_in_time(probe_port, "/ready") < PROBE_SECONDS, 30, "ready")
    with _closing(_slow_senders(port, CAP)) as held:
        wait_until(lambda: _tasks(service) >= CAP, 20, "every API connection busy")
        held.extend(_slow_readers(port, 16, METRICS))
        times: list[float] = []
        deadline = time.monotonic() + WATCH_SECONDS
        while time.monotonic() < deadline:
            times += [_answered_in_time(probe_port, p) for p in ("/live", "/ready", "/metrics")]
        assert len(times) >= 3 and max(times) < PROBE_SECONDS, times
        assert _tasks(service) >= CAP  # the API's connections were held all along


def test_a_slow_reader_on_the_probe_port_is_cut_off_at_the_answer_deadline(
    start_service: ServiceFactory,
) -> None:
    """A client pipelining /metrics on the probe port and never reading holds its connection
    no longer than the probes' header and answer deadlines (2 s each); /live answers there
    meanwhile."""
    service = start_service(BLACKBOX_PROBE_PORT="0")
    assert service.probe_endpoints is not None
    probe_port = service.probe_endpoints.port
    server = service.probe_endpoints.server
    with _closing(_slow_readers(probe_port, 1, METRICS)):
        wait_until(lambda: len(server.server_state.connections) == 1, 10, "the slow reader in")
        started = time.monotonic()
        assert _answered_in_time(probe_port, "/live") < PROBE_SECONDS
        wait_until(lambda: not server.server_state.connections, 10, "the slow reader cut off")
    most = PROBE_LIMITS.header_seconds + PROBE_LIMITS.answer_seconds + 1.0
    assert time.monotonic() - started < most


def test_an_answer_not_written_by_its_deadline_closes_the_connection() -> None:
    """A probe whose answer hangs (here a route that never returns) is not waited for: its
    connection is aborted at the request deadline (0.5 s here, 2 s on the probe port), so
    a probe never holds a connection past it, whatever the app does."""
    hanging = FastAPI()

    @hanging.get("/live")
    async def never() -> None:
        await asyncio.Event().wait()

    limits = replace(PROBE_LIMITS, request_seconds=0.5)
    server = Endpoints("127.0.0.1", 0, hanging, limits=limits)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /live HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert sock.recv(1024) == b""  # closed without an answer
            assert time.monotonic() - started < 0.5 + 1.0
    finally:
        server.stop()


def _port(service: Service) -> int:
    assert service.endpoints is not None
    return service.endpoints.port


def test_a_probe_port_in_use_is_named_and_leaves_the_api_port_free(
    start_service: ServiceFactory,
) -> None:
    """A probe port another process holds stops the start with an error naming
    BLACKBOX_PROBE_PORT, and the API's port, bound just before, is let go (a restart on the
    same ports then binds it)."""
    with socket.create_server(("0.0.0.0", 0)) as taken:  # noqa: S104 - as the service binds
        api_port = free_port()
        with pytest.raises(SettingsError, match="BLACKBOX_PROBE_PORT"):
            start_service(BLACKBOX_HTTP_PORT=str(api_port),
                          BLACKBOX_PROBE_PORT=str(taken.getsockname()[1]))  # fmt: skip
    with socket.create_server(("0.0.0.0", api_port)):  # noqa: S104 - refused if still held
        pass

"""The HTTP port against clients that would hold it, on the real server and real sockets
(guarantee 4: bad input never stops the service): idle connections and half-sent heads are
closed after the header timeout, a slow body is answered 408 after the body timeout, a
connection over the cap takes the place of the one waiting longest for its request or is
refused 503, errors of the accept loop are logged once per interval; /live answers."""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

from blackbox.api.relay import INTAKE_WAITS_PER_CALLER
from blackbox.role import Role
from blackbox.service import Service
from tests.integration.conftest import ServiceFactory
from tests.integration.test_api import AUTH, TOKEN
from tests.integration.test_api_callers import BILLING, SHOP, _auth, _tokens_file
from tests.kafkatools import wait_until

# A request head that never ends (no blank line after it).
HALF_HEAD = b"GET /live HTTP/1.1\r\nHost: localhost\r\n"
# 400 requests sent at once (pipelined), 31 KB of answer each: more than the buffers hold
# for a client that never reads.
PIPELINED = b"GET /api/openapi.json HTTP/1.1\r\nHost: localhost\r\n\r\n" * 400
# The same, of the service's own OpenAPI document (/openapi.json, about as large).
DOCUMENTS = b"GET /openapi.json HTTP/1.1\r\nHost: localhost\r\n\r\n" * 400
# A call of the API, whole.
STATS = (
    b"GET /api/v1/stats HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
    + AUTH["Authorization"].encode()
    + b"\r\n\r\n"
)
# A create whose body is announced, then sent a byte at a time.
SLOW_POST = (
    b"POST /api/v1/schedules HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Authorization: " + AUTH["Authorization"].encode() + b"\r\nContent-Length: 1000\r\n\r\n{"
)
# The service's HTTP server alone, in a process of its own with few file descriptors:
# argv[1] is the descriptor limit; with argv[2] == "starve", once serving, it takes every
# descriptor left, as a leak elsewhere in the process would; argv[3], if given, is the
# header timeout in seconds. Beside the probes it serves the API's OpenAPI document (31 KB)
# at /api/openapi.json.
SERVER = """
import os, resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
from fastapi import FastAPI
from blackbox import logs
from blackbox.api import app, server
from blackbox.health import Health
from blackbox.metrics import Metrics
logs.configure("json", "info")
server.LOG_EVERY_SECONDS = 1.0
metrics = Metrics()
served, document = app.probes_app(Health({}, metrics), metrics), FastAPI()
document.include_router(app.router)
served.mount("/api", document)
limits = server.Limits(*map(float, sys.argv[3:4]))
endpoints = server.Endpoints("127.0.0.1", 0, served, limits=limits)
endpoints.start()
started_by = time.monotonic() + 30
while not endpoints.server.started:
    if time.monotonic() > started_by:
        raise SystemExit("the server did not start within 30 s")
    time.sleep(0.01)  # the poll of a wait with a deadline
held = []
while sys.argv[2:3] == ["starve"]:
    try:
        held.append(open(os.devnull))
    except OSError:
        break
print(endpoints.port, flush=True)
sys.stdin.read()
"""


def _port(service: Service) -> int:
    assert service.endpoints is not None
    return service.endpoints.port


def _live(port: int) -> int:
    """/live's status on a new connection (0: no answer in 2 s)."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/live", timeout=2).status_code
    except httpx.HTTPError:
        return 0


class Conn:
    """One client connection: what the server sent on it, and whether it closed it."""

    def __init__(self, port: int, first: bytes = b"", receive_buffer: int = 0,
                 source: str = "127.0.0.1") -> None:  # fmt: skip
        self.sock = socket.socket()
        if receive_buffer:  # set before connecting: it sizes the window the server sees
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.bind((source, 0))  # another loopback address: another client
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(first)
        self.received = b""
        self.closed = False

    def poll(self) -> bool:
        """Whether the server closed the connection (reading what it sent first)."""
        while not self.closed and _readable(self.sock):
            try:
                part = self.sock.recv(65536)
            except ConnectionResetError:
                part = b""
            self.received += part
            self.closed = not part
        return self.closed

    def body(self) -> dict[str, str]:
        parsed: dict[str, str] = orjson.loads(self.received.split(b"\r\n\r\n", 1)[1])
        return parsed


def _open(port: int, count: int, first: bytes = b"", receive_buffer: int = 0,
          source: str = "127.0.0.1") -> list[Conn]:  # fmt: skip
    return [Conn(port, first, receive_buffer, source) for _ in range(count)]


def _clients(port: int, count: int, first: bytes) -> list[Conn]:
    """One connection from each of `count` loopback addresses (127.0.0.2 on): `count` clients."""
    return [Conn(port, first, source=f"127.0.0.{2 + n}") for n in range(count)]


def _closed(conns: list[Conn]) -> list[Conn]:
    return [c for c in conns if c.poll()]


@contextlib.contextmanager
def _closing(conns: list[Conn]) -> Iterator[list[Conn]]:
    try:
        yield conns
    finally:
        for conn in conns:
            conn.sock.close()


def test_idle_and_half_sent_requests_are_closed_after_the_header_timeout(
    start_service: ServiceFactory,
) -> None:
    """Guarantee 4: 40 idle connections and 40 that sent half a request head are closed
    once the header timeout (1 s) has passed, a half-sent head answered 408; so is a
    kept-alive connection that starts its next head and stalls. /live answers all along."""
    port = _port(start_service(BLACKBOX_HTTP_HEADER_TIMEOUT="1"))
    with _closing(_open(port, 40) + _open(port, 40, HALF_HEAD)) as held:
        kept = Conn(port, b"GET /live HTTP/1.1\r\nHost: localhost\r\n\r\n")
        held.append(kept)
        wait_until(lambda: kept.poll() or b"\r\n\r\n{" in kept.received, 5, "/live answered")
        assert kept.received.startswith(b"HTTP/1.1 200 ") and not kept.closed
        kept.received = b""
        kept.sock.sendall(HALF_HEAD)
        assert _live(port) == 200
        wait_until(lambda: _live(port) == 200 and len(_closed(held)) == len(held), 10,
                   "every idle and half-sent connection closed")  # fmt: skip
    assert [c.received for c in held[:40]] == [b""] * 40
    assert all(c.received.startswith(b"HTTP/1.1 408 ") for c in held[40:])
    assert {c.body()["error"] for c in held[40:]} == {"request_timeout"}


def test_a_slow_body_is_answered_408_after_the_body_timeout(
    start_service: ServiceFactory,
) -> None:
    """Guarantee 4: a create whose 1,000-byte body comes a byte every 0.2 s (never idle
    long) is answered 408 and closed once the body timeout (1 s) has passed; /live
    answers meanwhile."""
    port = _port(start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_HTTP_BODY_TIMEOUT="1"))
    with _closing(_open(port, 1, SLOW_POST)) as (slow,):
        stop = threading.Event()
        trickle = threading.Thread(target=_trickle, args=(slow.sock, stop), daemon=True)
        trickle.start()
        try:
            wait_until(lambda: _live(port) == 200 and slow.poll(), 10, "the slow body refused")
        finally:
            stop.set()
            trickle.join(5)
    assert slow.received.startswith(b"HTTP/1.1 408 "), slow.received
    assert slow.body()["error"] == "request_timeout"


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """A slow client: a byte every 0.2 s until stopped or refused."""
    with contextlib.suppress(OSError):
        while not stop.wait(0.2):
            sock.sendall(b" ")


def test_connections_over_the_cap_replace_idle_ones_or_are_refused_503(
    start_service: ServiceFactory,
) -> None:
    """Guarantee 4: with a cap of 10 connections, 30 idle ones leave the 10 newest open
    (each over the cap closed the one waiting longest) and /live answers; with the 10 all
    busy (bodies on their way), a call of the API on one more is answered 503 and closed
    at once; once the busy ones end, /live answers again."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_HTTP_MAX_CONNECTIONS="10",
                            BLACKBOX_HTTP_HEADER_TIMEOUT="30",
                            BLACKBOX_HTTP_BODY_TIMEOUT="30")  # fmt: skip
    port = _port(service)
    with _closing(_open(port, 30)) as idle:
        wait_until(lambda: len(_closed(idle)) >= 20, 10, "the 20 oldest idle closed")
        assert _closed(idle) == idle[:20]
        assert _live(port) == 200
    with _closing(_open(port, 10, SLOW_POST)) as busy:
        wait_until(lambda: _tasks(service) == 10, 10, "10 requests in progress")
        with _closing(_open(port, 1, STATS)) as (over,):
            wait_until(over.poll, 5, "the refusal")
        assert over.received.startswith(b"HTTP/1.1 503 "), over.received
        assert over.body()["error"] == "unavailable"
        assert _closed(busy) == []
    wait_until(lambda: _live(port) == 200, 10, "/live once the busy connections ended")


def test_probes_answer_while_every_connection_is_busy(start_service: ServiceFactory) -> None:
    """Guarantee 4: with the cap of 10 connections all busy (10 clients each sending a
    body slowly), /live, /ready and /metrics still answer 200 on new connections (a few
    are kept beyond the cap for them), so the pod is not restarted; a call of the API over
    the cap is answered 503 and closed."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_HTTP_MAX_CONNECTIONS="10",
                            BLACKBOX_HTTP_HEADER_TIMEOUT="30",
                            BLACKBOX_HTTP_BODY_TIMEOUT="30")  # fmt: skip
    port = _port(service)
    with _closing(_clients(port, 10, SLOW_POST)) as busy:
        wait_until(lambda: _tasks(service) == 10, 10, "10 requests in progress")
        for path in ("/live", "/ready", "/metrics"):
            answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
            assert answer.status_code == 200, (path, answer.text)
        over = httpx.get(f"http://127.0.0.1:{port}/api/v1/stats", headers=AUTH, timeout=5)
        assert (over.status_code, over.json()["error"]) == (503, "unavailable")
        assert _closed(busy) == []


def test_a_client_that_reads_its_answers_slowly_is_cut_off_at_the_answer_timeout(
    start_service: ServiceFactory,
) -> None:
    """Guarantee 4: a client that pipelines requests and reads their answers a little at a
    time (its writes never held back as long as the header timeout) is aborted once its
    answer bytes have waited the answer timeout (1 s): the server holds its connection no
    more (what the kernel still sends it holds no descriptor); /live answers meanwhile."""
    service = start_service(BLACKBOX_HTTP_HEADER_TIMEOUT="30",
                            BLACKBOX_HTTP_ANSWER_TIMEOUT="1")  # fmt: skip
    port = _port(service)
    with _closing(_open(port, 1, DOCUMENTS, receive_buffer=1024)) as (slow,):
        stop = threading.Event()
        reading = threading.Thread(target=_sip, args=(slow, stop), daemon=True)
        reading.start()
        try:
            wait_until(lambda: slow.received.startswith(b"HTTP/1.1 200 "), 10, "answers")
            wait_until(lambda: _live(port) == 200 and not _holds(service, slow), 15,
                       "the slow reader cut")  # fmt: skip
        finally:
            stop.set()
            reading.join(5)


def _holds(service: Service, conn: Conn) -> bool:
    """Whether the service's server holds a connection of `conn`."""
    assert service.endpoints is not None
    address = conn.sock.getsockname()
    return any(tuple(getattr(c, "client", None) or ()) == address
               for c in service.endpoints.server.server_state.connections)  # fmt: skip


def _sip(conn: Conn, stop: threading.Event) -> None:
    """A slow reader: 2 KiB every 0.1 s until stopped or closed."""
    while not stop.wait(0.1):
        try:
            part = conn.sock.recv(2048)
        except OSError:  # aborted, or closed by the test
            return
        conn.received += part
        if not part:
            return


def test_one_client_address_holds_at_most_its_share_of_connections(
    start_service: ServiceFactory,
) -> None:
    """Guarantee 4: with at most 3 connections per client address, a 4th busy request from
    one address is answered 503 and closed at once while the cap (100) has room, and
    another address is served; idle connections over the share close that address's
    oldest idle one."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_HTTP_HEADER_TIMEOUT="30",
                            BLACKBOX_HTTP_BODY_TIMEOUT="30",
                            BLACKBOX_HTTP_MAX_CONNECTIONS_PER_CLIENT="3")  # fmt: skip
    port = _port(service)
    with _closing(_open(port, 3, SLOW_POST, source="127.0.0.2")) as busy:
        wait_until(lambda: _tasks(service) == 3, 10, "3 requests in progress")
        with _closing(_open(port, 1, source="127.0.0.2")) as (over,):
            wait_until(over.poll, 5, "the refusal")
        assert over.received.startswith(b"HTTP/1.1 503 "), over.received
        assert "127.0.0.2" not in over.body()["reason"]
        assert _live(port) == 200
        assert _closed(busy) == []
    with _closing(_open(port, 5, source="127.0.0.3")) as idle:
        wait_until(lambda: len(_closed(idle)) >= 2, 10, "the 2 oldest idle closed")
        assert _closed(idle) == idle[:2]


def _tasks(service: Service) -> int:
    """Requests the service's server is working on."""
    assert service.endpoints is not None
    return len(service.endpoints.server.server_state.tasks)


def _serve(tmp_path: Path, limit: int, *mode: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    log = tmp_path / "server.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-c", SERVER, str(limit), *mode],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=output)  # fmt: skip
    assert process.stdout is not None
    return process, int(process.stdout.readline()), log


@contextlib.contextmanager
def _stopping(process: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        process.kill()
        process.communicate(timeout=10)


def test_idle_connections_past_the_descriptor_limit_leave_live_answering(
    tmp_path: Path,
) -> None:
    """Guarantee 4: 201 idle connections to a server limited to 160 file descriptors (the
    attack that made /live time out) leave /live answering 200: the cap stays under the
    descriptors the process has, and a new connection takes an idle one's place."""
    process, port, log = _serve(tmp_path, 160)
    with _stopping(process), _closing(_open(port, 201)):
        wait_until(lambda: _live(port) == 200, 10, "/live answering")
    assert b"accept" not in log.read_bytes()


def test_accept_errors_are_logged_once_per_interval(tmp_path: Path) -> None:
    """Guarantee 4: with every file descriptor of the process taken, connections the
    server cannot accept are logged once per interval (1 s here) with how many failed,
    not once per failure (380,921 lines in 65 s before)."""
    process, port, log = _serve(tmp_path, 160, "starve")
    with _stopping(process), _closing(_open(port, 5)):
        started = time.monotonic()
        wait_until(lambda: len(_accept_lines(log)) >= 3, 10, "three accept-error lines")
        lines = _accept_lines(log)
        assert len(lines) <= time.monotonic() - started + 2, lines[:5]
    events = [orjson.loads(line) for line in lines]
    assert {e["event"] for e in events} == {"http_accept_failed"}
    assert all(e["times"] >= 1 and "Too many open files" in e["error"] for e in events)


def test_pipelining_clients_that_never_read_leave_no_descriptor_held(tmp_path: Path) -> None:
    """Guarantee 4: 3 waves of 60 connections, each pipelining 400 requests behind a 1 KiB
    receive buffer and never reading (the attack that held 300 descriptors against a cap
    of 128), to a server limited to 160 descriptors with a header timeout of 1 s: each
    connection counts until its socket is gone, one whose answers stop draining is dropped
    after the timeout, its descriptor freed at once. After every wave the server holds
    none of its connections and /live answers; no connection fails to be accepted."""
    process, port, log = _serve(tmp_path, 160, "serve", "1")
    with _stopping(process), _closing([]) as held:
        before = _descriptors(process.pid)
        for _ in range(3):
            held.extend(_open(port, 60, PIPELINED, receive_buffer=1024))
            wait_until(lambda: _descriptors(process.pid) <= before and _live(port) == 200, 10,
                       "the wave's connections dropped, /live answering")  # fmt: skip
    assert b"accept" not in log.read_bytes()


def test_requests_waiting_for_the_intake_leave_live_answering(
    start_service: ServiceFactory, tmp_path: Path
) -> None:
    """Guarantee 4: with no intake to answer (a dispatch-only service), 60 cancels at once
    of one caller's ids, by a token for that caller alone, leave /live answering within
    2 s throughout (the probes need no worker thread); at most INTAKE_WAITS_PER_CALLER of
    them wait for the intake's answer (504 when it does not come), the rest are answered
    503 `unavailable` with Retry-After at once; and another caller's cancels, sent while
    the flood waits, still wait for their answers: one caller's load never refuses
    another's."""
    service = start_service(
        Role.DISPATCH,
        BLACKBOX_DELIVERY_TIMEOUT="3",
        BLACKBOX_API_TOKENS_FILE=_tokens_file(tmp_path / "tokens.yaml"),
    )
    port = _port(service)
    answers: list[httpx.Response] = []
    others: list[httpx.Response] = []
    cancels = [threading.Thread(target=_cancel, args=(port, "billing", BILLING, f"id-{n}",
                                                      answers))
               for n in range(60)]  # fmt: skip
    for cancel in cancels:
        cancel.start()
    wait_until(lambda: len(answers) >= 60 - INTAKE_WAITS_PER_CALLER, 20,
               "the flood's refusals answered")  # fmt: skip
    other = [threading.Thread(target=_cancel, args=(port, "shop", SHOP, f"id-{n}", others))
             for n in range(INTAKE_WAITS_PER_CALLER)]  # fmt: skip
    for cancel in other:
        cancel.start()
    lives = []
    while any(cancel.is_alive() for cancel in cancels + other):
        lives.append(_live(port))
    for cancel in cancels + other:
        cancel.join()
    assert set(lives) == {200}, lives
    statuses = sorted(answer.status_code for answer in answers)
    waited = INTAKE_WAITS_PER_CALLER
    assert statuses == [503] * (60 - waited) + [504] * waited, statuses
    assert [answer.status_code for answer in others] == [504] * waited, "shop waited too"
    refused = [answer for answer in answers if answer.status_code == 503]
    assert {(a.json()["error"], a.headers["retry-after"]) for a in refused} == {
        ("unavailable", "1")
    }


def _cancel(
    port: int, caller: str, token: str, schedule_id: str, answers: list[httpx.Response]
) -> None:
    url = f"http://127.0.0.1:{port}/api/v1/schedules/@{caller}/{schedule_id}"
    answers.append(httpx.delete(url, headers=_auth(token), timeout=30))


def _descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _accept_lines(log: Path) -> list[bytes]:
    return [line for line in log.read_bytes().splitlines() if b"accept" in line]


def _readable(sock: socket.socket) -> bool:
    """Whether `sock` has something to read (or was closed), without waiting. poll(), not
    select(): a test process holding many descriptors hands out numbers past select's 1024."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))

"""Every limit of the HTTP port answers in whole (guarantee 4: bad input never stops the
service, and a client is told why): a request line too long is answered 414, a head too
large 431, a body too large 413, a body too slow 408, a connection over the cap 503, each
with `Connection: close`, a length the body matches and a body naming the limit; the
connection is closed only once the answer has left, so a client still sending reads it
instead of a reset. Real clients on real sockets read each answer to its end."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import orjson
import pytest
from structlog.testing import capture_logs

from blackbox.api.closing import MAX_HEAD_BYTES
from blackbox.service import Service
from tests.integration.conftest import ServiceFactory
from tests.integration.test_api import AUTH, TOKEN
from tests.integration.test_api_http_limits import SLOW_POST, _clients, _closing, _tasks
from tests.kafkatools import wait_until

# The body limit the service derives from a BLACKBOX_MAX_MESSAGE_BYTES of 1,000.
MESSAGE_BYTES = 1000
BODY_LIMIT = 2 * MESSAGE_BYTES + 65_536
LONG_QUERY = "a" * 99_000  # schemathesis sent one this long


@pytest.fixture
def port(start_service: ServiceFactory) -> int:
    """A service whose API takes the test token and bodies of at most BODY_LIMIT bytes."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_MAX_MESSAGE_BYTES=str(MESSAGE_BYTES),
                            BLACKBOX_HTTP_BODY_TIMEOUT="1")  # fmt: skip
    assert service.endpoints is not None
    return service.endpoints.port


def _send_whole(port: int, request: bytes) -> socket.socket:
    """A connection that sent all of `request` (the server must read it to let it go)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(request)
    return sock


def _whole_answer(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, str]]:
    """The answer read to the server's close: status, headers, JSON body. A reset fails the
    test (ConnectionResetError), as does a body shorter or longer than announced."""
    received = b""
    with sock:
        while part := sock.recv(65536):
            received += part
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, value in (line.split(":", 1) for line in lines)}  # fmt: skip
    assert "transfer-encoding" not in headers, head
    assert int(headers["content-length"]) == len(body), head
    return int(status_line.split()[1]), headers, orjson.loads(body)


def _expect(answer: tuple[int, dict[str, str], dict[str, str]], status: int, error: str,
            names: str) -> None:  # fmt: skip
    got, headers, body = answer
    assert (got, headers.get("connection"), body["error"]) == (status, "close", error), answer
    assert names in body["reason"], body


def test_an_over_long_request_line_is_answered_414_in_whole(port: int) -> None:
    """A query string of 99 KB (over the head's MAX_HEAD_BYTES) is answered 414 naming
    the limit, read whole by a raw socket that sent it all, and by httpx (60 KB: it sends
    no longer URL); it was a chunked 400 followed by a reset, or read whole."""
    request = f"GET /api/v1/schedules?x={LONG_QUERY} HTTP/1.1\r\nHost: localhost\r\n\r\n"
    for _ in range(5):  # the reset came most times, not every time
        answer = _whole_answer(_send_whole(port, request.encode()))
        _expect(answer, 414, "uri_too_long", f"{MAX_HEAD_BYTES} bytes")
    url = f"http://127.0.0.1:{port}/api/v1/schedules?x={LONG_QUERY[:60_000]}"
    refused = httpx.get(url, headers=AUTH, timeout=10)
    assert (refused.status_code, refused.json()["error"]) == (414, "uri_too_long")


def test_headers_too_large_are_answered_431_in_whole(port: int) -> None:
    """A request line of a few bytes with 40 KB of headers is answered 431 naming the limit."""
    big = "".join(f"X-Filler-{n}: {'b' * 1000}\r\n" for n in range(40))
    request = f"GET /api/v1/stats HTTP/1.1\r\nHost: localhost\r\n{big}\r\n"
    answer = _whole_answer(_send_whole(port, request.encode()))
    _expect(answer, 431, "headers_too_large", f"{MAX_HEAD_BYTES} bytes")


def test_a_malformed_request_is_answered_400_in_whole(port: int) -> None:
    """A head HTTP/1.1 cannot read is answered 400 with a JSON body, not a chunked text."""
    answer = _whole_answer(_send_whole(port, b"GET / HTTP/1.1\r\nno colon here\r\n\r\n"))
    _expect(answer, 400, "bad_request", "HTTP/1.1")


def test_refused_heads_are_logged_once_per_interval(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A fuzzer's flood of malformed and over-long heads is logged as one
    `http_requests_refused` line per interval with their count, never a line each (uvicorn
    logged "Invalid HTTP request received." for every one)."""
    long_line = f"GET /?x={LONG_QUERY} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
    with capture_logs() as events:
        for _ in range(10):
            _whole_answer(_send_whole(port, b"GET / HTTP/1.1\r\nno colon here\r\n\r\n"))
            _whole_answer(_send_whole(port, long_line))
        wait_until(lambda: any(e["event"] == "http_requests_refused" for e in events), 5,
                   "the refusals logged")  # fmt: skip
    refused = [e for e in events if e["event"] == "http_requests_refused"]
    assert len(refused) <= 2 and sum(e["times"] for e in refused) >= 1, refused
    assert not [r for r in caplog.records if "Invalid HTTP request" in r.getMessage()]


def _chunks(total: int) -> Iterator[bytes]:
    for _ in range(total // 65536):
        yield b"x" * 65536


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
def test_a_body_too_large_is_answered_413_in_whole(port: int, announced: bool) -> None:
    """A 4 MB create, its length announced (refused before a byte is read) or chunked
    (refused once past the limit), is answered 413 naming the limit to httpx, which sends
    the whole body before it reads."""
    url = f"http://127.0.0.1:{port}/api/v1/schedules"
    body = b"x" * 4_194_304 if announced else _chunks(4_194_304)
    refused = httpx.post(url, content=body, headers=AUTH, timeout=10)
    assert refused.status_code == 413
    assert refused.headers["connection"] == "close"
    assert f"{BODY_LIMIT} bytes" in refused.json()["reason"]


def test_a_body_too_slow_is_answered_408_in_whole(port: int) -> None:
    """A body announced and not sent within the body timeout (1 s) is answered 408 naming
    the timeout, read whole while the client still sends a byte now and then."""
    sock = _send_whole(port, SLOW_POST)
    stop = threading.Event()
    trickle = threading.Thread(target=_trickle, args=(sock, stop), daemon=True)
    trickle.start()
    try:
        answer = _whole_answer(sock)
    finally:
        stop.set()
        trickle.join(5)
    _expect(answer, 408, "request_timeout", "within 1 s")


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        try:
            sock.sendall(b" ")
        except OSError:
            return


def test_a_connection_over_the_cap_is_answered_503_in_whole(
    start_service: ServiceFactory,
) -> None:
    """With the cap of 4 connections busy, a create with a 60 KB body on one more is
    answered 503 naming the cap, read whole although the server read none of its body."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_HTTP_MAX_CONNECTIONS="4",
                            BLACKBOX_HTTP_HEADER_TIMEOUT="30",
                            BLACKBOX_HTTP_BODY_TIMEOUT="30")  # fmt: skip
    port = _port(service)
    with _closing(_clients(port, 4, SLOW_POST)):
        wait_until(lambda: _tasks(service) == 4, 10, "4 requests in progress")
        body = b"{" + b" " * 60_000
        head = SLOW_POST.split(b"Content-Length")[0] + b"Content-Length: %d\r\n\r\n" % len(body)
        answer = _whole_answer(_send_whole(port, head + body))
    _expect(answer, 503, "unavailable", "too many connections")


def _port(service: Service) -> int:
    assert service.endpoints is not None
    return service.endpoints.port

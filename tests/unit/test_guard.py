"""What an HTTP request passes before the API reads its body (guarantee 4: bodies are bounded
and authenticated before they are read), driven in-process through the ASGI interface."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Message

from blackbox.api.errors import ApiError
from blackbox.api.guard import BodyGate, OpenHosts

LIMIT = 1000
TOKEN = "Bearer unit-token-0123456789"  # noqa: S105 - a test token


def authorize(header: str | None) -> None:
    if header != TOKEN:
        raise ApiError(401, "unauthorized", "send the token")


def echo_app() -> FastAPI:
    """An app whose POST reads the whole body, as the API's create and reschedule do."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"read": len(await request.body())}

    @app.get("/{path:path}")
    async def anything(path: str) -> dict[str, str]:
        return {"path": path}

    return app


@dataclass
class Exchange:
    """One request driven through an ASGI app: the body offered, what was read, the answer."""

    parts: list[bytes]
    endless: bool = False  # more parts than any limit, for as long as they are asked for
    asked: int = 0
    sent: list[Message] = field(default_factory=list)

    async def receive(self) -> Message:
        self.asked += 1
        if self.endless:
            return {"type": "http.request", "body": b"x" * 100, "more_body": True}
        part = self.parts[self.asked - 1] if self.asked <= len(self.parts) else b""
        return {"type": "http.request", "body": part, "more_body": self.asked < len(self.parts)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        (start,) = [m for m in self.sent if m["type"] == "http.response.start"]
        return int(start["status"])

    @property
    def headers(self) -> dict[str, str]:
        (start,) = [m for m in self.sent if m["type"] == "http.response.start"]
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def body(self) -> object:
        return orjson.loads(b"".join(m.get("body", b"") for m in self.sent))


def call(  # noqa: PLR0913 - the request's parts, each with a default
    app: ASGIApp, method: str, path: str, exchange: Exchange,
    headers: dict[str, str] | None = None, *, host: str = "127.0.0.1:8080",
) -> Exchange:  # fmt: skip
    given = {"host": host, **(headers or {})}
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in given.items()],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080)}  # fmt: skip

    async def exchanged() -> None:
        await app(scope, exchange.receive, exchange.send)

    asyncio.run(exchanged())
    return exchange


def gate() -> BodyGate:
    return BodyGate(echo_app(), authorize, LIMIT)


CHUNKED = {"transfer-encoding": "chunked", "authorization": TOKEN}


def test_a_streamed_body_is_cut_at_the_limit_and_nothing_more_is_read() -> None:
    """A chunked body is counted as it arrives: the part that takes it past the limit is the
    last one read, the answer is 413 (closing the connection), and the app's own answer to
    its cut body is never sent."""
    done = call(gate(), "POST", "/echo", Exchange([], endless=True), CHUNKED)
    assert done.asked == LIMIT // 100 + 1
    reason = "a request body is at most 1000 bytes"
    assert (done.status, done.body) == (413, {"error": "too_large", "reason": reason})
    assert done.headers["connection"] == "close"


def test_a_body_at_the_limit_is_read_whole() -> None:
    """Exactly `limit` bytes, in parts, reach the app; the connection stays open."""
    done = call(gate(), "POST", "/echo", Exchange([b"y" * 100] * 10), CHUNKED)
    assert (done.status, done.body) == (200, {"read": LIMIT})
    assert "connection" not in done.headers


def test_an_unauthorised_write_is_refused_before_its_body_is_read() -> None:
    """A call that changes something without the token is answered 401 from its headers:
    not one part of its body is read. Reads go on to the app, which checks them itself."""
    chunked = {"transfer-encoding": "chunked"}
    done = call(gate(), "POST", "/echo", Exchange([], endless=True), chunked)
    assert (done.asked, done.status, done.headers["connection"]) == (0, 401, "close")
    wrong = {**chunked, "authorization": "Bearer wrong-token-0123456789"}
    assert call(gate(), "DELETE", "/echo", Exchange([b"x"]), wrong).status == 401
    assert call(gate(), "GET", "/stats", Exchange([])).status == 200


def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    """Content-Length over the limit (or not a number) is 413 before any byte is read."""
    for declared in (str(LIMIT + 1), "-1", "1e9"):
        headers = {"content-length": declared, "authorization": TOKEN}
        done = call(gate(), "POST", "/echo", Exchange([], endless=True), headers)
        assert (done.asked, done.status) == (0, 413)


def test_an_answer_given_before_the_body_was_read_closes_the_connection() -> None:
    """A route that answers without reading an announced body closes the connection, so the
    server never reads the rest of it to keep the connection."""
    headers = {"content-length": "500"}
    done = call(gate(), "GET", "/stats", Exchange([b"z" * 500]), headers)
    assert (done.asked, done.status, done.headers["connection"]) == (0, 200, "close")
    assert "connection" not in call(gate(), "GET", "/stats", Exchange([])).headers


def test_an_open_api_answers_only_the_hosts_it_serves() -> None:
    """With the API open, a Host other than localhost, 127.0.0.1, [::1] and the configured
    names is refused 400 (DNS rebinding); the probes answer any Host."""
    hosts = OpenHosts(echo_app(), allowed=("blackbox.example.com", "*.corp.example"))
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080", "BLACKBOX.example.com",
                 "ui.corp.example:443"):  # fmt: skip
        assert call(hosts, "GET", "/api/v1/stats", Exchange([]), host=host).status == 200, host
    for host in ("attacker.example", "127.0.0.1.attacker.example", "corp.example.evil", ""):
        assert call(hosts, "GET", "/api/v1/stats", Exchange([]), host=host).status == 400, host
    for probe in ("/live", "/ready", "/metrics"):
        assert call(hosts, "GET", probe, Exchange([]), host="10.1.2.3:8080").status == 200


def test_the_probes_answer_any_host_however_they_are_asked() -> None:
    """/live, /ready and /metrics answer whatever Host names the pod (the kubelet and
    Prometheus call it by its IPv4 or IPv6 address), an empty one, and with a trailing
    slash (which the router then redirects) as they answer a local name."""
    hosts = OpenHosts(echo_app(), allowed=())
    for probe in ("/live", "/ready", "/metrics", "/live/", "/ready/", "/metrics/"):
        for host in ("10.1.2.3:8080", "10.1.2.3", "[fd00:10:244::5]:8080", "", "pod.local"):
            assert call(hosts, "GET", probe, Exchange([]), host=host).status == 200, (probe, host)
    assert call(hosts, "GET", "/metricsx", Exchange([]), host="10.1.2.3").status == 400

"""What an HTTP request must pass before the API reads its body: its token, its size and
its pace as it streams in, and, with the API open, the Host it names.

FastAPI reads a body before it runs a route's dependencies, so the token of a call that
changes something (any method but GET, HEAD and OPTIONS) is checked here, from the headers
alone. A body is counted as the server hands it over, chunked or not: past the limit the
answer is 413 and nothing more is read; a body not in whole `seconds` after the request
began is answered 408 (a client sending a byte now and then holds no connection for long).
A response given before its request's body was read closes the connection: keeping it would
mean reading (and dropping) the rest of the body.

With the API open (reads open, or every call in local development), only the names it serves
are answered: a page on another site whose name was pointed at 127.0.0.1 (DNS rebinding) is
refused 400. The probes answer any Host: the kubelet and Prometheus name the pod by address.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blackbox.api.errors import ApiError, refusal

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PROBES = frozenset({"/live", "/ready", "/metrics"})
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
CLOSE = {"connection": "close"}

Authorize = Callable[[str | None], None]
"""Raises ApiError unless this Authorization header (None: none) may change things."""


class Refused(Exception):
    """A request body was refused while it was read (answered already)."""


class TooLarge(Refused):
    """A request body went past the limit (answered 413)."""


class TooSlow(Refused):
    """A request body did not come in time (answered 408)."""


class BodyGate:
    """Authorises a call that changes something from its headers, then bounds its body in
    size and in time."""

    def __init__(self, app: ASGIApp, authorize: Authorize, limit: int,
                 seconds: float = 30.0) -> None:  # fmt: skip
        self.app, self.authorize, self.limit, self.seconds = app, authorize, limit, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refused = self._refusal(scope["method"], headers)
        if refused is not None:
            await refused(scope, receive, send)
            return
        body = Body(scope, receive, send, self.limit, self.seconds)
        with contextlib.suppress(Refused):  # answered as it was refused
            await self.app(scope, body.receive, body.send)

    def _refusal(self, method: str, headers: Headers) -> Response | None:
        if method not in SAFE_METHODS:
            try:
                self.authorize(headers.get("authorization"))
            except ApiError as e:
                return refusal(e.status, e.error, e.reason, CLOSE)
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return too_large(self.limit)
        return None


def too_large(limit: int) -> Response:
    return refusal(413, "too_large", f"a request body is at most {limit} bytes", CLOSE)


def too_slow(seconds: float) -> Response:
    return refusal(408, "request_timeout", f"a request body must come within {seconds:g} s",
                   CLOSE)  # fmt: skip


class Body:
    """One request's body, counted as the server hands it over; past `limit`, or not whole
    `seconds` after the request began, it answers 413 or 408 in the app's stead and ends
    the request."""

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, limit: int, seconds: float = 30.0
    ) -> None:
        self.scope, self._receive, self._send, self.limit = scope, receive, send, limit
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        headers = Headers(scope=scope)
        announced = "transfer-encoding" in headers or headers.get("content-length", "0") != "0"
        self.complete = not announced  # every part of the body has arrived
        self.read = 0
        self.started = False  # a response has begun
        self.over = False

    async def receive(self) -> Message:
        if self.over:
            return {"type": "http.disconnect"}
        message = await self._in_time()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.read > self.limit:
                await self._refuse(too_large(self.limit))
                raise TooLarge(f"{self.read} bytes read of a body limited to {self.limit}")
        return message

    async def _in_time(self) -> Message:
        """The next message; while the body is incomplete, by the deadline (408 after it)."""
        if self.complete:  # what comes now is the client leaving: no deadline
            return await self._receive()
        try:
            return await asyncio.wait_for(self._receive(), self.deadline - time.monotonic())
        except TimeoutError:
            await self._refuse(too_slow(self.seconds))
            raise TooSlow(f"{self.read} bytes of a body in {self.seconds:g} s") from None

    async def send(self, message: Message) -> None:
        if self.over:
            return  # the 413 is the answer
        if message["type"] == "http.response.start":
            self.started = True
            if not self.complete:
                message.setdefault("headers", [])
                MutableHeaders(scope=message).update(CLOSE)
        await self._send(message)

    async def _refuse(self, answer: Response) -> None:
        self.over = True
        if not self.started:
            self.started = True
            await answer(self.scope, self._receive, self._send)


class OpenHosts:
    """Starlette's TrustedHostMiddleware for everything but the probes."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        hosts = [*LOCAL_HOSTS, *allowed]
        self.checked = TrustedHostMiddleware(app, allowed_hosts=hosts, www_redirect=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # With a trailing slash too: the router redirects it to the probe, whatever the Host.
        probe = scope["type"] == "http" and scope["path"].rstrip("/") in PROBES
        await (self.app if probe else self.checked)(scope, receive, send)

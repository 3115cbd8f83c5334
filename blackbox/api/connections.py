"""Connections: what one client may hold of the HTTP port, and for how long.

uvicorn's h11 protocol gives a connection all the time it wants to send a request head
(idle or half-sent) and takes every connection the process has descriptors for; one client
could hold the port and starve the probes. Here each connection has `header_seconds` to send
a whole request head, counted from connecting or from its last answer (a half-sent head is
answered 408, an idle connection closed), and at most `max_connections` are open: one more
closes the connection that has waited longest for a request, or, with every connection busy
with a request, is answered 503 and closed. A request's body has its own deadline, in
guard.py. Refusals are logged once per interval with how many there were, never one line
per refusal (`Throttled`).

A client that does not read its answers holds nothing for long either: a connection counts
until its socket is gone, and one whose answers have not left (writes held back for
`header_seconds`, or unsent bytes when its head deadline passes) is aborted, its descriptor
freed at once. Closed gracefully, a socket whose answer cannot leave keeps its descriptor
for as long as the client does not read, out of any count. A pipelined request begun when
the previous answer ends is a request in progress: the head deadline waits for an idle
connection.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import h11
import orjson
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger("blackbox.api.connections")
# Connections the kernel holds for the server to accept (uvicorn's default).
LISTEN_BACKLOG = 2048


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a connection has to send a request head, and how many may be open."""

    header_seconds: float = 10.0
    max_connections: int = 1000

    @property
    def accept_batch(self) -> int:
        """Connections accepted at once: asyncio accepts that many before the first of them
        meets the cap, so the descriptors a burst takes stay near the cap."""
        return max(8, min(LISTEN_BACKLOG, self.max_connections // 8))

    def within(self, free_descriptors: int) -> Limits:
        """At most half the free descriptors: the rest stay for Redis, Kafka and files."""
        most = max(1, free_descriptors // 2)
        return self if self.max_connections <= most else replace(self, max_connections=most)


def _raw(status: str, error: str, reason: str, *extra: bytes) -> bytes:
    """A whole HTTP/1.1 answer, written to a connection that is then closed."""
    body = orjson.dumps({"error": error, "reason": reason})
    head = [f"HTTP/1.1 {status}".encode(), b"content-type: application/json",
            b"connection: close", b"content-length: %d" % len(body), *extra]  # fmt: skip
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Throttled:
    """An event logged at most once per `seconds`, with how many times it happened since."""

    def __init__(self, event: str, seconds: float) -> None:
        self.event, self.seconds = event, seconds
        self.times = 0
        self.last = -math.inf
        self.fields: dict[str, Any] = {}
        self.pending: asyncio.TimerHandle | None = None

    def note(self, loop: asyncio.AbstractEventLoop, **fields: Any) -> None:
        self.times += 1
        self.fields = fields
        if self.pending is None:
            wait = max(0.0, self.last + self.seconds - loop.time())
            self.pending = loop.call_later(wait, self._write, loop)

    def _write(self, loop: asyncio.AbstractEventLoop) -> None:
        log.warning(self.event, times=self.times, per_seconds=self.seconds, **self.fields)
        self.times, self.last, self.pending = 0, loop.time(), None


@dataclass
class Gate:
    """What the connections of one server share: the limits, those open, and those waiting
    for a request head (the one waiting longest first)."""

    limits: Limits
    refused: Throttled
    open: set[Guarded] = field(default_factory=set)
    waiting: dict[Guarded, None] = field(default_factory=dict)

    def make_room(self) -> bool:
        """Whether one more connection may open: under the cap, or once the connection
        waiting longest for a request is closed."""
        if len(self.open) < self.limits.max_connections:
            return True
        longest = next(iter(self.waiting), None)
        if longest is not None:
            longest.time_out()
        return longest is not None


class Guarded(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head and a cap on connections
    (a subclass per server carries its `gate`)."""

    gate: ClassVar[Gate]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.stalled: asyncio.TimerHandle | None = None  # writes held back: abort at this
        self.head_begun = False  # some bytes of the awaited request head have come
        self.refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.gate.make_room():
            self._refuse(transport)
            return
        self.gate.open.add(self)
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self.head_begun = self.head_begun or self in self.gate.waiting
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head came in whole
            self._stop_waiting()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn has begun the next pipelined request, if one came: that one is busy. A
        # closing connection waits too, for its answer to leave.
        if self.conn.their_state is h11.IDLE or self.transport.is_closing():
            self._await_head()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.stalled is None:
            self.stalled = self.loop.call_later(self.gate.limits.header_seconds,
                                                self.transport.abort)  # fmt: skip

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_stall()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self._stop_waiting()
        self._stop_stall()
        self.gate.open.discard(self)  # only now: till then the socket holds a descriptor
        super().connection_lost(exc)

    def time_out(self) -> None:
        """Close the connection for want of a request head (408 for one begun)."""
        self._stop_waiting()
        if self.head_begun and not self.transport.is_closing():
            reason = f"a request head must come within {self.gate.limits.header_seconds:g} s"
            self.transport.write(_raw("408 Request Timeout", "request_timeout", reason))
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # the client does not read: close() would wait for it
        else:
            self.transport.close()

    def _await_head(self) -> None:
        self._stop_waiting()
        unread, _ = self.conn.trailing_data  # the start of a pipelined head
        self.head_begun = bool(unread)
        self.gate.waiting[self] = None
        self.deadline = self.loop.call_later(self.gate.limits.header_seconds, self.time_out)

    def _stop_waiting(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.gate.waiting.pop(self, None)

    def _stop_stall(self) -> None:
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None

    def _refuse(self, transport: asyncio.Transport) -> None:
        self.refused, self.transport = True, transport
        most = self.gate.limits.max_connections
        transport.write(_raw("503 Service Unavailable", "unavailable",
                             f"too many connections (at most {most}): try again",
                             b"retry-after: 1"))  # fmt: skip
        transport.close()
        self.gate.refused.note(self.loop, most=most)


def protocol_for(gate: Gate) -> type[Guarded]:
    """The protocol class of one server: its connections share `gate`."""

    class Bound(Guarded):
        pass

    Bound.gate = gate
    return Bound

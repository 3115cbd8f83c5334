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
`header_seconds`, unsent bytes when its head deadline passes, or answer bytes still unsent
`answer_seconds` after the write that found nothing waiting, however fast it reads) is
aborted, its descriptor freed at once. Closed gracefully, a socket whose answer cannot leave
keeps its descriptor for as long as the client does not read, out of any count. A pipelined
request begun when the previous answer ends is a request in progress: the head deadline
waits for an idle connection.

The probes outlive a full cap: PROBE_RESERVE connections beyond it are kept for /live,
/ready and /metrics (anything else asked on one is answered 503 and closed), so clients
holding every connection busy never get a healthy pod restarted. And one client address
holds at most `per_client` connections (reserved ones included): over it, that address's
connection waiting longest for a request is closed, or, with all of them busy, the new one
is answered 503 and closed; other addresses are untouched.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

import h11
import orjson
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from blackbox.api.closing import MALFORMED, Lingering, head_refusal, raw_answer

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope

log = structlog.get_logger("blackbox.api.connections")
# uvicorn's protocol logs a warning per malformed request (a fuzzer's flood: a line each);
# the refusals are counted in `Gate.heads` instead. Its errors are still logged.
protocol_log = logging.getLogger("blackbox.api.protocol")
protocol_log.setLevel(logging.ERROR)
# Connections the kernel holds for the server to accept (uvicorn's default).
LISTEN_BACKLOG = 2048
# Connections beyond the cap kept for the probes: a kubelet and a scraper or two, with room.
PROBE_RESERVE = 16
# The paths a reserved connection may ask for.
PROBE_PATHS = frozenset({"/live", "/ready", "/metrics"})
# Connections refused at the cap that may linger at once (closing.py) to let their 503 be
# read; past that number a refused connection is closed at once (they hold descriptors out
# of any count meanwhile).
MAX_REFUSED_LINGERING = 64


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a connection has to send a request head and to take an answer, how many
    may be open, and how many of one client address."""

    header_seconds: float = 10.0
    max_connections: int = 1000
    answer_seconds: float = 30.0
    per_client: int = 100
    # The most seconds from a request head's end to its answer's last byte written (None:
    # no such bound); past it the connection is aborted. Its bytes then have answer_seconds
    # to leave.
    request_seconds: float | None = None

    @property
    def accept_batch(self) -> int:
        """Connections accepted at once: asyncio accepts that many before the first of them
        meets the cap, so the descriptors a burst takes stay near the cap."""
        return max(8, min(LISTEN_BACKLOG, self.max_connections // 8))

    def within(self, free_descriptors: int) -> Limits:
        """At most half the free descriptors: the rest stay for Redis, Kafka and files."""
        most = max(1, free_descriptors // 2)
        return self if self.max_connections <= most else replace(self, max_connections=most)


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


class Room(enum.Enum):
    """Whether a new connection may open, and for what."""

    ANY = "any"  # any request
    PROBES = "probes"  # /live, /ready and /metrics alone (a reserved connection)
    NONE = "none"  # refused


@dataclass
class Gate:
    """What the connections of one server share: the limits, those open (reserved ones
    apart), each client address's, and those waiting for a request head (the one waiting
    longest first)."""

    limits: Limits
    refused: Throttled
    cut: Throttled | None = None  # answers that did not leave in time
    heads: Throttled | None = None  # request heads refused: too long (414, 431), malformed
    open: set[Guarded] = field(default_factory=set)
    reserved: set[Guarded] = field(default_factory=set)
    clients: dict[str, set[Guarded]] = field(default_factory=dict)
    waiting: dict[Guarded, None] = field(default_factory=dict)
    refused_lingering: int = 0  # connections refused at the cap, lingering

    def make_room(self, client: str) -> Room:
        """Whether one more connection from `client` may open, and for what: over the
        client's share, in the place of its own connection waiting longest for a request;
        else under the cap, or in the place of any connection waiting longest; else in the
        probes' reserve while it has room."""
        own = self.clients.get(client)
        if own is not None and len(own) >= self.limits.per_client:
            return self._replace(own)
        if len(self.open) - len(self.reserved) < self.limits.max_connections:
            return Room.ANY
        taken = self._replace(self.open)
        if taken is Room.NONE and len(self.reserved) < PROBE_RESERVE:
            return Room.PROBES
        return taken

    def _replace(self, among: set[Guarded]) -> Room:
        """Close the connection of `among` waiting longest for a request; the new one takes
        its place (NONE: none waits)."""
        longest = next((c for c in self.waiting if c in among), None)
        if longest is None:
            return Room.NONE
        longest.time_out()
        return Room.PROBES if longest in self.reserved else Room.ANY

    def enter(self, connection: Guarded, room: Room) -> None:
        self.open.add(connection)
        self.clients.setdefault(connection.client_host, set()).add(connection)
        if room is Room.PROBES:
            self.reserved.add(connection)

    def leave(self, connection: Guarded) -> None:
        self.open.discard(connection)
        self.reserved.discard(connection)
        own = self.clients.get(connection.client_host)
        if own is not None:
            own.discard(connection)
            if not own:
                del self.clients[connection.client_host]


class Sending:
    """A connection's transport, telling each run of answer bytes it could not send at once:
    `started` is called when a write leaves bytes waiting where none waited before; and
    closing as `close` says (a lingering close, closing.py). Everything else is the
    transport's own."""

    def __init__(self, transport: asyncio.Transport, started: Callable[[], None],
                 close: Callable[[], None]) -> None:  # fmt: skip
        self._transport, self._started, self._close = transport, started, close
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self._close()

    def is_closing(self) -> bool:
        return self.closed or self._transport.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        fresh = self._transport.get_write_buffer_size() == 0
        self._transport.write(data)
        if fresh and self._transport.get_write_buffer_size():
            self._started()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def probes_only(app: ASGI3Application) -> ASGI3Application:
    """`app` for the probe paths; 503 and close for any other (a reserved connection)."""

    async def guarded(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            await app(scope, receive, send)
            return
        body = orjson.dumps({"error": "unavailable",
                             "reason": "too many connections: try again"})  # fmt: skip
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"connection", b"close"),
            (b"retry-after", b"1"), (b"content-length", b"%d" % len(body))]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    return guarded


class Guarded(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head and a cap on connections
    (a subclass per server carries its `gate`)."""

    gate: ClassVar[Gate]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.stalled: asyncio.TimerHandle | None = None  # writes held back: abort at this
        self.sending: asyncio.TimerHandle | None = None  # answer bytes waiting: check at this
        self.sending_since = 0.0  # when the waiting answer bytes began to wait
        self.overdue: asyncio.TimerHandle | None = None  # the request's answer: abort at this
        self.head_begun = False  # some bytes of the awaited request head have come
        self.refused = False
        self.lingering: Lingering | None = None  # closing once its answer has left
        self.raw: asyncio.Transport | None = None  # the transport itself, not Sending
        self.client_host = ""
        self.logger = protocol_log

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self.client_host = str(peer[0]) if isinstance(peer, tuple) else ""
        room = self.gate.make_room(self.client_host)
        if room is Room.NONE:
            self._refuse(transport)
            return
        self.gate.enter(self, room)
        super().connection_made(transport)
        self.raw = transport
        sending = Sending(transport, self._answer_waits, self._linger)
        self.transport = cast(asyncio.Transport, sending)
        if room is Room.PROBES:
            self.app = probes_only(self.app)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:
            self.lingering.dropped(len(data))  # answered: what comes now is dropped
            return
        if self.refused:
            return
        self.head_begun = self.head_begun or self in self.gate.waiting
        super().data_received(data)

    def handle_events(self) -> None:
        if self.conn.their_state is h11.IDLE:  # a head is awaited: within MAX_HEAD_BYTES?
            refused = head_refusal(self.conn.trailing_data[0])
            if refused is not None:
                self._refuse_head(refused)
                return
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head came in whole
            self._stop_waiting()
            self._answer_by(self.gate.limits.request_seconds)

    def _answer_by(self, seconds: float | None) -> None:
        """Abort the connection unless this request's answer has left within `seconds`."""
        self._stop_overdue()
        if seconds is not None:
            self.overdue = self.loop.call_later(seconds, self.transport.abort)

    def _stop_overdue(self) -> None:
        if self.overdue is not None:
            self.overdue.cancel()
            self.overdue = None

    def send_400_response(self, msg: str) -> None:
        """A head h11 cannot read: a whole JSON 400 (uvicorn's own is chunked text)."""
        self._refuse_head(MALFORMED)

    def _refuse_head(self, answer: bytes) -> None:
        self._stop_waiting()
        self.transport.write(answer)
        self.transport.close()
        if self.gate.heads is not None:
            self.gate.heads.note(self.loop, last_status=int(answer.split(b" ", 2)[1]))

    def _linger(self) -> None:
        """Close once the answer has left (closing.py): Sending's close."""
        if self.lingering is None and self.raw is not None:
            self._stop_waiting()
            self.lingering = Lingering(self.raw, self.loop)

    def on_response_complete(self) -> None:
        self._stop_overdue()  # written: what is left to leave has answer_seconds
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
        if self.lingering is not None:
            self.lingering.cancel()
        if self.refused:
            self.gate.refused_lingering -= self.lingering is not None
            return
        self._stop_waiting()
        self._stop_stall()
        self._stop_overdue()
        if self.sending is not None:
            self.sending.cancel()
        self.gate.leave(self)  # only now: till then the socket holds a descriptor
        super().connection_lost(exc)

    def time_out(self) -> None:
        """Close the connection for want of a request head (408 for one begun, closed once
        it has left; an idle one at once)."""
        self._stop_waiting()
        if self.head_begun and not self.transport.is_closing():
            reason = f"a request head must come within {self.gate.limits.header_seconds:g} s"
            self.transport.write(raw_answer("408 Request Timeout", "request_timeout", reason))
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # the client does not read: close() would wait for it
        elif self.head_begun:
            self.transport.close()
        elif self.raw is not None:
            self.raw.close()  # idle: nothing to answer, no place to keep

    def _answer_waits(self) -> None:
        """Answer bytes wait to leave, none waited before: they have answer_seconds."""
        self.sending_since = self.loop.time()
        if self.sending is None:
            self._check_sending()

    def _check_sending(self) -> None:
        """Abort once answer bytes have waited answer_seconds; check again at their end."""
        self.sending = None
        if not self.transport.get_write_buffer_size() or self.transport.is_closing():
            return
        due = self.sending_since + self.gate.limits.answer_seconds
        if self.loop.time() >= due:
            self.transport.abort()
            if self.gate.cut is not None:
                self.gate.cut.note(self.loop, answer_seconds=self.gate.limits.answer_seconds)
            return
        self.sending = self.loop.call_at(due, self._check_sending)

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
        transport.write(raw_answer("503 Service Unavailable", "unavailable",
                                   f"too many connections (at most {most}, "
                                   f"{self.gate.limits.per_client} per client): try again",
                                   b"retry-after: 1"))  # fmt: skip
        if self.gate.refused_lingering < MAX_REFUSED_LINGERING:
            self.gate.refused_lingering += 1
            self.lingering = Lingering(transport, self.loop)
        else:
            transport.close()
        self.gate.refused.note(self.loop, most=most, per_client=self.gate.limits.per_client)


def protocol_for(gate: Gate) -> type[Guarded]:
    """The protocol class of one server: its connections share `gate`."""

    class Bound(Guarded):
        pass

    Bound.gate = gate
    return Bound

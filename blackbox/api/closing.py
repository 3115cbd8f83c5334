"""How the HTTP port ends a connection it refuses: a whole answer, then a close that waits for
the answer to leave.

A server that closes a socket whose client is still sending (a body it refused, a head too
large to read, a request on a connection over the cap) makes the kernel reset the
connection, and the reset can reach the client before it has read the answer: it sees
"connection reset by peer" where a 413 or a 503 was written. So a refused connection is
closed as Apache and nginx close one ("lingering close"): the answer is written with
`Connection: close` and a length, the sending side is shut (the client reads the answer and
then the end of the stream), what the client still sends is read and dropped, and the socket
is closed when the client closes its side, LINGER_SECONDS have passed or LINGER_BYTES were
dropped (a refused body is not read to its end, however long), aborted if the answer has
still not left (a client that does not read holds nothing for long).

A request head is bounded too: MAX_HEAD_BYTES for its line and headers. h11 checks that
bound only on a head that came in several parts (a head of 99 KB that arrives in one read
was read whole), so it is checked here on every head, whole or not: a request line longer
than the bound is answered 414, a head longer than it 431.
"""

from __future__ import annotations

import asyncio
import re

import orjson

# The most bytes of a request head (its line and headers): h11's own default, named here.
MAX_HEAD_BYTES = 16 * 1024
# How long a refused connection's client has to read the answer and close its side, and
# the most it may send meanwhile (read and dropped).
LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * 1024
# The end of a request head, and of its request line (h11 reads a lone LF as a line end too).
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(rb"\r?\n")


def raw_answer(status: str, error: str, reason: str, *extra: bytes) -> bytes:
    """A whole HTTP/1.1 answer, written to a connection that is then closed."""
    body = orjson.dumps({"error": error, "reason": reason})
    head = [f"HTTP/1.1 {status}".encode(), b"content-type: application/json",
            b"connection: close", b"content-length: %d" % len(body), *extra]  # fmt: skip
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def head_refusal(unread: bytes) -> bytes | None:
    """The answer to a request head (the start of `unread`) over MAX_HEAD_BYTES: 414 for a
    request line over it, 431 for the rest; None while it is within the bound."""
    end = _HEAD_END.search(unread)
    if (end.end() if end else len(unread)) <= MAX_HEAD_BYTES:
        return None
    line_end = _LINE_END.search(unread)
    if line_end is None or line_end.start() > MAX_HEAD_BYTES:
        reason = f"a request line (method, path and query) is at most {MAX_HEAD_BYTES} bytes"
        return raw_answer("414 URI Too Long", "uri_too_long", reason)
    reason = f"a request head (its line and headers) is at most {MAX_HEAD_BYTES} bytes"
    return raw_answer("431 Request Header Fields Too Large", "headers_too_large", reason)


MALFORMED = raw_answer("400 Bad Request", "bad_request",
                       "the request is not HTTP/1.1 this server can read")  # fmt: skip


class Lingering:
    """A connection being closed once its answer has left: its sending side shut, what it
    still receives dropped (its protocol tells `dropped`), closed when the client closes,
    at the end of LINGER_SECONDS or past LINGER_BYTES (aborted if the answer is still
    waiting to leave)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 seconds: float = LINGER_SECONDS) -> None:  # fmt: skip
        self.transport = transport
        self.end: asyncio.TimerHandle | None = None
        self.left = LINGER_BYTES
        if transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # sent after the answer's bytes
        transport.resume_reading()  # what comes is read and dropped, not left to reset
        self.end = loop.call_later(seconds, self._close)

    def dropped(self, count: int) -> None:
        """`count` more bytes came and were dropped: past LINGER_BYTES, close now."""
        self.left -= count
        if self.left < 0 and self.end is not None:
            self.end.cancel()
            self._close()

    def _close(self) -> None:
        self.end = None
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def cancel(self) -> None:
        """The connection is gone: nothing left to close."""
        if self.end is not None:
            self.end.cancel()
            self.end = None

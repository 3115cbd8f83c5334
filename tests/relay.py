"""A TCP relay on loopback that plays the network between two processes in a test.

Why it exists: replication lag cannot be made real on loopback by pausing a process. SIGSTOP
on a Redis replica leaves the primary's stream in the kernel's socket buffers, and a replica
continued after its primary died still receives all of it (DEV-STACK.md, "Redis as production
runs it": 0 lost). A relay between primary and replica that `hold()`s what the primary sends
and then `cut()`s the connections loses it for good, as a network partition does. In front of
the primary, a relay stands in for a managed Redis's endpoint, a name that moves to the
promoted replica: `switch()`.

Each connection through the relay is pumped by one thread per direction; "upstream" is the
target's side (the primary), "downstream" the side that connected to the relay.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from contextlib import suppress

LOOPBACK = "127.0.0.1"
CHUNK = 65_536
CONNECT_TIMEOUT = 2.0  # seconds; on loopback a connect is refused or accepted at once
JOIN_TIMEOUT = 5.0  # seconds close() waits for each pump thread


class _Link:
    """One connection through the relay: the downstream socket, the upstream one, and a pump
    per direction. Upstream bytes wait (unread in the kernel's buffers, or one chunk here)
    while the relay holds; downstream bytes always flow."""

    def __init__(self, down: socket.socket, up: socket.socket, held: Callable[[], bool]) -> None:
        self._down, self._up, self._held = down, up, held
        # Forward each chunk at once, as the network would: with Nagle's algorithm a relay
        # adds a delayed ACK's wait (~40 ms) to every small reply, a latency no real path has.
        for sock in (down, up):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Taken around every upstream send: hold() passing it means no send is under way.
        self.gate = threading.Condition()
        self.closed = threading.Event()
        self._pumps_left = 2
        self._count_lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._pump, args=(down, up, False), daemon=True),
            threading.Thread(target=self._pump, args=(up, down, True), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, holdable: bool) -> None:
        try:
            while chunk := source.recv(CHUNK):
                if not self._forward(chunk, sink, holdable):
                    break
        except OSError:
            pass  # the other side went away, or the link was cut
        finally:
            self.close()
            self._pump_ended()

    def _forward(self, chunk: bytes, sink: socket.socket, holdable: bool) -> bool:
        """Send `chunk` on, once the relay lets upstream bytes through; False if the link
        closed first (the chunk is dropped, as a cut network drops it)."""
        if not holdable:
            sink.sendall(chunk)
            return True
        with self.gate:
            while self._held() and not self.closed.is_set():
                self.gate.wait()
            if self.closed.is_set():
                return False
            sink.sendall(chunk)
        return True

    def close(self) -> None:
        """Shut both sockets down (waking the pumps) and drop whatever is held."""
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self._down, self._up):
            with suppress(OSError):  # not connected any more
                sock.shutdown(socket.SHUT_RDWR)
        with self.gate:
            self.gate.notify_all()

    def _pump_ended(self) -> None:
        """The last pump out closes the sockets: no thread still uses their descriptors."""
        with self._count_lock:
            self._pumps_left -= 1
            last = self._pumps_left == 0
        if last:
            self._down.close()
            self._up.close()  # unread upstream bytes make this a reset: they are gone

    def wake(self) -> None:
        with self.gate:
            self.gate.notify_all()

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)


class Relay:
    """Forwards every connection made to `listen_port` (0: a free one, see `port`) on
    `listen_host` (another loopback address, such as 127.0.0.2, lets a relay take a port
    that a server bound to 127.0.0.1 only also uses) to `target_port` on 127.0.0.1, until
    `close()`."""

    def __init__(
        self, listen_port: int, target_port: int, listen_host: str = LOOPBACK,
        held_source: str | None = None,
    ) -> None:  # fmt: skip
        """`held_source`: hold() holds only the connections made from that address (a
        replica's), and others through the relay, such as a Sentinel's, flow on."""
        self.held_source = held_source
        self._target_port = target_port
        self._held = False
        self._links: list[_Link] = []
        self._lock = threading.Lock()  # guards the target and the links
        self._listener = socket.create_server((listen_host, listen_port))
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @property
    def connections(self) -> int:
        """How many connections through the relay are open now."""
        with self._lock:
            return sum(not link.closed.is_set() for link in self._links)

    def switch(self, target_port: int) -> None:
        """Send new connections to `target_port`; close the open ones, as an endpoint that
        moves to another server does."""
        with self._lock:
            self._target_port = target_port
        self.cut()

    def hold(self) -> None:
        """Stop forwarding what upstream sends, on every connection (new ones too); returns
        once no upstream byte is on its way through."""
        self._held = True
        for link in self._open_links():
            with link.gate:
                pass  # a send under way when `_held` was set has finished

    def release(self) -> None:
        """Forward what upstream sent meanwhile, and from now on."""
        self._held = False
        for link in self._open_links():
            link.wake()

    def cut(self) -> None:
        """Close every connection at once, dropping what was held: a network cut. A hold
        stays in force for the connections made afterwards."""
        for link in self._open_links():
            link.close()

    def close(self) -> None:
        """Stop listening, cut every connection and wait for the relay's threads."""
        with suppress(OSError):  # not listening any more
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        self._acceptor.join(JOIN_TIMEOUT)
        self.cut()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.join(JOIN_TIMEOUT)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_links(self) -> list[_Link]:
        with self._lock:
            self._links = [link for link in self._links if any(t.is_alive() for t in link.threads)]
            return list(self._links)

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            self._connect(down)

    def _connect(self, down: socket.socket) -> None:
        """Open the upstream side of a new connection; a target that refuses it closes the
        downstream side, as a connection refused would."""
        holdable = self.held_source in (None, down.getpeername()[0])
        with self._lock:  # a switch() waits: no link to the old target opens after it
            try:
                up = socket.create_connection((LOOPBACK, self._target_port), CONNECT_TIMEOUT)
            except OSError:
                down.close()
                return
            up.settimeout(None)
            self._links.append(_Link(down, up, lambda: holdable and self._held))

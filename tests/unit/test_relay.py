"""The test relay (tests/relay.py) on loopback sockets of the test's own: it forwards both
ways, holds what upstream sends, loses it when cut, and moves to another target."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from blackbox.dev.servers import free_port
from tests.relay import LOOPBACK, Relay

TIMEOUT = 5.0  # seconds any expected byte may take on loopback
QUIET = 0.3  # seconds a held byte must fail to show up in


@pytest.fixture
def target() -> Iterator[socket.socket]:
    with socket.create_server((LOOPBACK, 0)) as server:
        server.settimeout(TIMEOUT)
        yield server


@pytest.fixture
def relay(target: socket.socket) -> Iterator[Relay]:
    with Relay(0, target.getsockname()[1]) as r:
        yield r


def connect(relay: Relay, target: socket.socket) -> tuple[socket.socket, socket.socket]:
    """A client connected through `relay`, and the target's side of its connection."""
    client = socket.create_connection((LOOPBACK, relay.port), TIMEOUT)
    upstream, _ = target.accept()
    upstream.settimeout(TIMEOUT)
    return client, upstream


def test_bytes_flow_both_ways_through_the_relay(relay: Relay, target: socket.socket) -> None:
    """The relay is transparent until told otherwise."""
    client, upstream = connect(relay, target)
    with client, upstream:
        client.sendall(b"ping")
        assert upstream.recv(16) == b"ping"
        upstream.sendall(b"pong")
        assert client.recv(16) == b"pong"


def test_held_upstream_bytes_arrive_only_once_released(relay: Relay, target: socket.socket) -> None:
    """hold() stops what upstream sends (what downstream sends still flows); release() lets
    it through, in order."""
    client, upstream = connect(relay, target)
    with client, upstream:
        relay.hold()
        upstream.sendall(b"held")
        client.sendall(b"ack")
        assert upstream.recv(16) == b"ack"
        client.settimeout(QUIET)
        with pytest.raises(TimeoutError):
            client.recv(16)
        relay.release()
        client.settimeout(TIMEOUT)
        assert client.recv(16) == b"held"


def test_a_cut_drops_what_was_held(relay: Relay, target: socket.socket) -> None:
    """cut() closes every connection, and bytes held at that instant never arrive: the
    network partition that makes a replica miss what its primary applied."""
    client, upstream = connect(relay, target)
    with client, upstream:
        relay.hold()
        upstream.sendall(b"lost")
        relay.cut()
        assert client.recv(16) == b""
        assert relay.connections == 0


def test_a_switch_closes_open_connections_and_sends_new_ones_to_the_new_target(
    relay: Relay, target: socket.socket
) -> None:
    """switch() moves the relay as a managed endpoint moves: old connections end."""
    client, upstream = connect(relay, target)
    with client, upstream, socket.create_server((LOOPBACK, 0)) as other:
        other.settimeout(TIMEOUT)
        relay.switch(other.getsockname()[1])
        assert client.recv(16) == b""
        moved, new_upstream = connect(relay, other)
        with moved, new_upstream:
            moved.sendall(b"hello")
            assert new_upstream.recv(16) == b"hello"


def test_a_refused_target_closes_the_client_connection(relay: Relay) -> None:
    """A dead target behind the relay looks like a dead server to the client."""
    relay.switch(free_port())
    with socket.create_connection((LOOPBACK, relay.port), TIMEOUT) as client:
        assert client.recv(16) == b""


def test_close_stops_listening(target: socket.socket) -> None:
    """After close() the relay's port refuses connections."""
    relay = Relay(0, target.getsockname()[1])
    relay.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((LOOPBACK, relay.port), TIMEOUT).close()

"""The HTTP connection gate's choices (connections.py), on stand-in connections: who takes
the place of whom under the cap, a client address's share and the probes' reserve. No
socket is opened."""

from __future__ import annotations

from typing import cast

import pytest

from blackbox.api.connections import PROBE_RESERVE, Gate, Guarded, Limits, Room, Throttled


class Stand:
    """A connection as the gate sees it: its client address, closed when timed out."""

    def __init__(self, gate: Gate, host: str, *, idle: bool, room: Room = Room.ANY) -> None:
        self.client_host, self.closed = host, False
        self.gate = gate
        gate.enter(cast(Guarded, self), room)
        if idle:
            gate.waiting[cast(Guarded, self)] = None

    def time_out(self) -> None:
        self.closed = True
        self.gate.waiting.pop(cast(Guarded, self), None)


def _gate(cap: int = 4, per_client: int = 100) -> Gate:
    return Gate(Limits(10.0, cap, 30.0, per_client), Throttled("refused", 10.0))


def test_under_the_cap_any_request_may_come() -> None:
    """A connection under the cap and the client's share is served as any other."""
    gate = _gate()
    Stand(gate, "a", idle=False)
    assert gate.make_room("a") is Room.ANY


def test_at_the_cap_the_longest_idle_connection_gives_its_place() -> None:
    """At the cap the connection waiting longest for a request is closed for the new one."""
    gate = _gate(cap=2)
    first, second = Stand(gate, "a", idle=True), Stand(gate, "b", idle=True)
    assert gate.make_room("c") is Room.ANY
    assert (first.closed, second.closed) == (True, False)


def test_at_the_cap_all_busy_only_probes_come_until_the_reserve_is_full() -> None:
    """With every connection busy, PROBE_RESERVE more are let in for the probes alone;
    then one more is refused."""
    gate = _gate(cap=2)
    for host in ("a", "b"):
        Stand(gate, host, idle=False)
    for n in range(PROBE_RESERVE):
        assert gate.make_room("kubelet") is Room.PROBES
        Stand(gate, f"k{n}", idle=False, room=Room.PROBES)
    assert gate.make_room("kubelet") is Room.NONE


@pytest.mark.parametrize("idle", [True, False])
def test_a_client_over_its_share_replaces_its_own_or_is_refused(idle: bool) -> None:
    """Over its share a client's own longest idle connection gives its place (never
    another client's); with all of its own busy it is refused though the cap has room."""
    gate = _gate(cap=100, per_client=2)
    other = Stand(gate, "b", idle=True)
    own = [Stand(gate, "a", idle=idle) for _ in range(2)]
    assert gate.make_room("a") is (Room.ANY if idle else Room.NONE)
    assert [c.closed for c in own] == [idle, False] and not other.closed


def test_leaving_frees_the_clients_share_and_the_reserve() -> None:
    """A connection gone counts no more against its client nor the reserve."""
    gate = _gate(cap=1, per_client=1)
    probe = Stand(gate, "k", idle=False, room=Room.PROBES)
    gate.leave(cast(Guarded, probe))
    assert (gate.clients, gate.reserved, gate.open) == ({}, set(), set())

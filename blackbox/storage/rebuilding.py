"""Rebuilding: the mark a rebuild from Kafka leaves in Redis while it runs.

A rebuild sets it before it deletes anything and clears it after its last write. A rebuild
that stopped half-way leaves it: a service started then would go on from the committed
offsets over a Redis half written back, so its intake waits, and the replica is not ready,
until a rebuild runs to its end (intake/rebuild.py; service.py reads it)."""

from __future__ import annotations

from blackbox.clock import now_ms
from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout


def key(layout: Layout) -> str:
    """String: the epoch ms the rebuild under way began."""
    return f"{layout.tag}:rebuilding"


def begin(client: RedisClient, layout: Layout) -> None:
    client.set(key(layout), str(now_ms()))


def end(client: RedisClient, layout: Layout) -> None:
    client.delete(key(layout))


def under_way(client: RedisClient, layout: Layout) -> bool:
    """Whether a rebuild began and has not finished (or stopped half-way)."""
    return bool(client.exists(key(layout)))

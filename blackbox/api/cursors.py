"""Listing cursors: where a listing stopped, sealed so that whoever holds one learns nothing
from it.

A listing walks every caller's ids in due order and keeps those its token may see, so it
may stop on another caller's id (its read budget spent) and the next page goes on from
there. That position (a due time and an id) is sealed with AES-GCM under a key kept in
Redis, made by the first replica that lists and shared by every replica: a cursor names no
id, and one this service did not hand out (forged, altered, or sealed under a key since
lost with Redis's data) is refused.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import redis
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from blackbox.errors import BadCursor
from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout

KEY_BYTES = 32
NONCE_BYTES = 12
# Bound into every seal: the key seals listing positions and nothing else.
PURPOSE = b"blackbox listing cursor 1"


@dataclass(frozen=True, slots=True)
class Position:
    """Where a listing stopped: the score and id of the last id it read."""

    score: int
    id: str


class Cursors:
    """Seals positions into cursors and opens them again, under the key `key` returns."""

    def __init__(self, key: Callable[[], bytes]) -> None:
        self.key = key

    def seal(self, position: Position) -> str:
        nonce = os.urandom(NONCE_BYTES)
        plain = orjson.dumps([position.score, position.id])
        sealed = AESGCM(self.key()).encrypt(nonce, plain, PURPOSE)
        return base64.urlsafe_b64encode(nonce + sealed).decode("ascii").rstrip("=")

    def open(self, cursor: str) -> Position:
        """The position `cursor` seals; BadCursor unless this service sealed it."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            plain = AESGCM(self.key()).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], PURPOSE)
            score, schedule_id = orjson.loads(plain)
        except (binascii.Error, ValueError, TypeError, InvalidTag) as e:
            raise BadCursor(f"cursor {cursor[:40]!r} was not handed out by this API") from e
        if not isinstance(score, int) or not isinstance(schedule_id, str):
            raise BadCursor(f"cursor {cursor[:40]!r} was not handed out by this API")
        return Position(score, schedule_id)


def key_name(layout: Layout) -> str:
    """String: the namespace's cursor key (in its own slot, beside the shard count)."""
    return f"{layout.tag}:cursor-key"


def redis_key(client: RedisClient, name: str) -> Callable[[], bytes]:
    """The key stored under `name`, made by whichever replica asks first (SET NX). Read at
    each use, one GET: a key Redis lost is replaced for every replica alike."""

    def key() -> bytes:
        found = client.get(name)
        if found is None:
            client.set(name, os.urandom(KEY_BYTES), nx=True)
            found = client.get(name)
        if not isinstance(found, bytes):
            raise redis.RedisError(f"{name} vanished as it was made")
        return found

    return key

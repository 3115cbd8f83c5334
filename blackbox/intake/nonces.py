"""Signature nonces seen by the intake, against replays of a signed record.

Each verified signature's nonce is stored with the intake coordinates of the record that
used it first (`SET NX GET EX`, one pipelined call per poll part). Another record with the
same nonce is a replay; the same record read again after a crash finds its own
coordinates and passes. A nonce is kept until its signature's issue time plus the maximum
age plus the clock skew (identity.py): past the last moment a copy could be read and still
accepted, however long the intake was away, so a replay is either remembered or too old.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from blackbox.intake.identity import Proof
from blackbox.storage.keys import Layout


class Nonces:
    """The nonces of one namespace, spread over its shards by nonce."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, layout: Layout) -> None:
        self.client = client
        self.layout = layout

    def first_uses(self, uses: Sequence[tuple[Proof, str]]) -> list[str | None]:
        """For each (proof, origin): None when `origin` is the first record to use the
        nonce, else the origin of the record that used it first. Raises redis.RedisError."""
        if not uses:
            return []
        pipe = self.client.pipeline(transaction=False)
        for proof, origin in uses:
            key = self.layout.keys_of(proof.nonce).nonce(proof.caller, proof.key_id, proof.nonce)
            pipe.set(key, origin, nx=True, get=True, ex=proof.remember_seconds)
        firsts = pipe.execute()
        return [
            None if first is None or first.decode() == origin else first.decode()
            for first, (_, origin) in zip(firsts, uses, strict=True)
        ]

"""NodeFailures: a Redis node failing in a firing round stalls only its own shards."""

from __future__ import annotations

from functools import partial

import pytest
import redis

from blackbox.firing.failures import NodeFailures


def test_a_failed_node_is_passed_over_and_the_others_fired() -> None:
    """Guarantee 5 on Redis Cluster: a master that died fails its shards' claims for the
    round; shards of the masters that answer are still fired, and the first error is
    raised once the round is done (the caller pauses and logs as before)."""
    nodes = {0: "a", 1: "b", 2: "a", 3: "b"}
    pools = {name: object() for name in "ab"}
    fired: list[int] = []
    tried: list[int] = []

    def claim(shard: int) -> None:
        tried.append(shard)
        if nodes[shard] == "a":
            raise redis.ConnectionError(f"node a is down (shard {shard})")
        fired.append(shard)

    failures = NodeFailures(lambda shard: pools[nodes[shard]])
    for shard in range(4):
        failures.attempt(shard, partial(claim, shard))
    assert fired == [1, 3]
    assert tried == [0, 1, 3]  # shard 2 shares the failed node: not tried again
    with pytest.raises(redis.ConnectionError, match="shard 0"):
        failures.raise_first()


def test_one_redis_ends_the_round_at_its_first_failure() -> None:
    """With one Redis every shard shares its node: one failed claim per round, as before."""
    pool = object()
    tried: list[int] = []

    def claim(shard: int) -> None:
        tried.append(shard)
        raise redis.TimeoutError("away")

    failures = NodeFailures(lambda _shard: pool)
    for shard in range(16):
        failures.attempt(shard, partial(claim, shard))
    assert tried == [0]
    with pytest.raises(redis.TimeoutError):
        failures.raise_first()


def test_a_round_without_failure_raises_nothing() -> None:
    """Nothing failed: raise_first is a no-op."""
    failures = NodeFailures(lambda _shard: object())
    failures.attempt(0, lambda: None)
    failures.raise_first()
    assert failures.first is None

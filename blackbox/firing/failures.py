"""NodeFailures: a Redis node that fails during a firing round is passed over for the rest of
the round, and the shards of the nodes that answer are fired all the same.

With one Redis every shard lives on one node, so the first failure ends the round as it
always did. On a Redis Cluster a master that dies (until its replica is promoted, seconds)
stalls only its own shards: without this, the first failed claim left the round and the
healthy masters' shards after it in the order waited too. The first error is raised once
the round is done, so the caller's pause, metric and log are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis


class NodeFailures:
    """The nodes that failed in one round, by the identity of their connection pool."""

    def __init__(self, node_of: Callable[[int], Any]) -> None:
        self._node_of = node_of
        self._failed: set[int] = set()
        self.first: redis.RedisError | None = None

    def by_node(self, shards: Sequence[int]) -> list[list[int]]:
        """`shards` grouped by their node, in the order each node first appears."""
        groups: dict[int, list[int]] = {}
        for shard in shards:
            groups.setdefault(id(self._node_of(shard)), []).append(shard)
        return list(groups.values())

    def attempt(self, shard: int, work: Callable[[], None]) -> None:
        """Run `work` for `shard` unless its node failed earlier in the round."""
        node = id(self._node_of(shard))
        if node in self._failed:
            return
        try:
            work()
        except redis.RedisError as e:
            self._failed.add(node)
            self.first = self.first or e

    def raise_first(self) -> None:
        """Raise the round's first failure, if any."""
        if self.first is not None:
            raise self.first

"""RetryPolicy: how much a claim takes, how long its lease runs, and how a failed delivery
is retried (backoff) or given up (dead-lettered after its attempts)."""

from __future__ import annotations

from dataclasses import dataclass

from blackbox.storage.store import DEFAULT_CLAIM_BYTES

# The fewest ids a shard's claim takes when shards are claimed together.
MIN_SHARD_CLAIM = 64


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the dispatcher claims and retries."""

    batch_limit: int
    lease_ms: int
    max_attempts: int
    backoff_ms: int
    backoff_max_ms: int
    dlq_topic: str
    events_topic: str
    batch_bytes: int = DEFAULT_CLAIM_BYTES  # most payload bytes one claim takes

    def shared(self, shards: int) -> tuple[int, int]:
        """Each shard's limits (ids, payload bytes) when `shards` are claimed together: a
        share of one claim's, no less than MIN_SHARD_CLAIM ids (one shard: the whole)."""
        limit = min(self.batch_limit, max(MIN_SHARD_CLAIM, self.batch_limit // shards))
        return limit, max(1, self.batch_bytes // shards)

    def retry_delay_ms(self, attempt: int) -> int:
        """Exponential backoff: base * 2^(attempt-1), capped."""
        return int(min(self.backoff_max_ms, self.backoff_ms * 2 ** min(attempt - 1, 30)))

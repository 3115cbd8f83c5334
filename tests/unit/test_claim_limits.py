"""How shards claimed together share one claim's limits (RetryPolicy.shared)."""

from __future__ import annotations

from blackbox.firing.retry import MIN_SHARD_CLAIM, RetryPolicy


def _policy(batch_limit: int, batch_bytes: int = 16_000) -> RetryPolicy:
    return RetryPolicy(batch_limit=batch_limit, lease_ms=30_000, max_attempts=3, backoff_ms=100,
                       backoff_max_ms=1000, dlq_topic="dlq", events_topic="events",
                       batch_bytes=batch_bytes)  # fmt: skip


def test_one_shard_claims_with_the_whole_limits() -> None:
    assert _policy(1000).shared(1) == (1000, 16_000)


def test_shards_claimed_together_take_one_claims_worth() -> None:
    """The shards due at one instant take about one claim's worth together (what a crash
    may deliver twice stays bounded); a shard's part never shrinks below MIN_SHARD_CLAIM."""
    assert _policy(3200).shared(16) == (200, 1000)
    assert _policy(1000).shared(16) == (MIN_SHARD_CLAIM, 1000)


def test_a_small_limit_is_never_raised() -> None:
    assert _policy(10).shared(16)[0] == 10

"""Nudges: their wire format, and publishing only a due time sooner than the last ahead."""

from __future__ import annotations

from blackbox.firing.nudges import Announcements, nudge_message, parse_nudge


def test_nudges_travel_as_shard_and_due_time() -> None:
    """Scale: a published nudge names its shard, so only that shard's firer wakes."""
    assert parse_nudge(nudge_message(7, 1_234).encode()) == (7, 1_234)
    assert parse_nudge(b"garbage") is None


def test_a_later_due_time_is_not_published_while_a_sooner_one_is_ahead() -> None:
    """Scale, no herd: an intake process publishes a shard's due time only when it is
    sooner than the last it published that is still ahead; the firer learns the rest from
    its claim. Once that time has passed the next one is published again."""
    announced = Announcements()
    assert announced.worth_publishing(0, 5_000, now_ms=1_000) is True
    assert announced.worth_publishing(0, 6_000, now_ms=1_000) is False
    assert announced.worth_publishing(1, 6_000, now_ms=1_000) is True  # another shard
    assert announced.worth_publishing(0, 4_000, now_ms=1_000) is True  # sooner
    assert announced.worth_publishing(0, 9_000, now_ms=4_000) is True  # 4,000 has passed

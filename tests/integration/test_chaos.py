"""Shortened fault suite on every change: crashes and hostile input (benchmarks.chaos)."""

from __future__ import annotations

from benchmarks import chaos


def test_killed_and_restarted_service_loses_nothing() -> None:
    """Guarantees 1 and 2: kill -9 under load, each kill once the replica reads intake and
    while ids are in flight; every accepted message is delivered at least once (counted by
    message), each under one `blackbox-id` (duplicates included), and copies of one id are
    the same schedule."""
    result = chaos.crash(messages=600, kills=3)

    mid_fire, mid_intake = result["kills_mid_fire"], result["kills_mid_intake"]
    assert isinstance(mid_fire, int) and mid_fire >= 2, result  # not an idle replica
    assert isinstance(mid_intake, int) and mid_intake >= 2, result
    assert result["accepted"] == 600
    assert result["lost"] == 0, result
    assert result["messages_under_two_ids"] == 0, result
    assert result["duplicates_consistent"] is True


def test_hostile_input_is_all_dead_lettered_and_good_records_still_fire() -> None:
    """Guarantee 4: 1,100 generated bad records each reach the DLQ with the expected reason;
    the good records between them are all delivered; the service stays up."""
    result = chaos.hostile_input(bad=1100, good_every=10)

    assert result["dead_lettered"] == 1100
    assert result["wrong_reason"] == 0
    assert result["good_delivered"] == result["good"] == 110
    assert result["service_alive"] is True


def test_broker_killed_and_restarted_on_its_data_loses_nothing() -> None:
    """Guarantees 1, 2 and 5: the Apache Kafka broker dies (SIGKILL) under load and starts
    again on the same log folder; every accepted message is delivered, each under one
    `blackbox-id`, copies of one id are the same schedule, and the service stays up."""
    result = chaos.broker_restart(messages=600, down_s=2.0)

    assert result["accepted"] == 600
    assert result["lost"] == 0, result
    assert result["messages_under_two_ids"] == 0, result
    assert result["duplicates_consistent"] is True
    assert result["service_alive"] is True

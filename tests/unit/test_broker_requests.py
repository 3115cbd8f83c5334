"""benchmarks.brokerrequests.per_message: the growth between two readings, per message."""

from __future__ import annotations

from benchmarks.brokerrequests import per_message


def test_growth_per_message_with_fetch_counted_once() -> None:
    before = {"Produce": 10, "Fetch": 100, "FetchConsumer": 90, "Metadata": 4,
              "BytesInPerSec": 1_000, "BytesOutPerSec": 500}  # fmt: skip
    after = {"Produce": 60, "Fetch": 300, "FetchConsumer": 280, "Metadata": 4, "OffsetCommit": 5,
             "BytesInPerSec": 26_000, "BytesOutPerSec": 10_500}  # fmt: skip
    assert per_message(before, after, 100) == {
        "Fetch": 2.0, "Produce": 0.5, "OffsetCommit": 0.05,
        "requests": 2.55, "bytes_in": 250.0, "bytes_out": 100.0,
    }  # fmt: skip


def test_nothing_read_gives_nothing() -> None:
    assert per_message(None, {"Produce": 1}, 10) is None
    assert per_message({"Produce": 1}, None, 10) is None

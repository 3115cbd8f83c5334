"""The API's follower of the events topic on a real broker: it reads only while requests
wait for answers, and a request after it rested still gets its answer."""

from __future__ import annotations

import orjson
import pytest

from blackbox.dev.servers import KafkaBroker
from blackbox.kafka import answers, clients
from blackbox.kafka.answers import Follower
from tests.kafkatools import produce, unique, wait_until


def _answer(key: bytes, offset: int) -> bytes:
    """An answer event to the intake record at (intake, 0, offset)."""
    intake = {"topic": "intake", "partition": 0, "offset": offset}
    return orjson.dumps({"outcome": "scheduled", "id": key.decode(), "intake": intake})


def test_a_resting_follower_reads_nothing_and_answers_the_next_request(
    broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee 7's answers, at no cost while idle: with no request for IDLE_SECONDS the
    follower stops reading the events topic (it gives up its partitions, so the broker
    serves it no fetch); the next request marks the topic's end again and gets its answer,
    while an answer written during the rest is never handed to it."""
    monkeypatch.setattr(answers, "IDLE_SECONDS", 0.5)
    topic = unique("events")
    clients.ensure_topics({"bootstrap.servers": broker.bootstrap}, [topic])
    follower = Follower({"bootstrap.servers": broker.bootstrap}, topic)
    follower.start()
    try:
        assert follower.ready(15)
        wait_until(lambda: not follower.following, 15, "a rest")
        produce(broker.bootstrap, topic, [_answer(b"old", 1)], key=b"old")

        assert follower.ready(15)
        assert follower.following
        with follower.expecting(b"new"):
            produce(broker.bootstrap, topic, [_answer(b"new", 2)], key=b"new")
            got = follower.wait(("intake", 0, 2), 15)
        assert got is not None
        assert got["id"] == "new"
        assert follower.wait(("intake", 0, 1), 0.5) is None  # written while it rested
    finally:
        follower.close()

"""The dispatcher on a real Redis, with a broker that never answers: waiting for delivery
reports must not make the next due message late."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka import Producer

from blackbox.clock import now_ms
from blackbox.dispatcher import Dispatcher, RetryPolicy
from blackbox.keys import Keys
from blackbox.localstack import RedisServer
from blackbox.metrics import Metrics
from blackbox.outbox import Outbox
from blackbox.schedule import Schedule
from blackbox.store import IntakeSlice, RedisStore
from tests.kafkatools import unique

POLICY = RetryPolicy(batch_limit=100, lease_ms=30_000, max_attempts=3, backoff_ms=100,
                     backoff_max_ms=1000, dlq_topic="dlq", events_topic="events")  # fmt: skip
REPORT_WAIT_S = 20.0


@pytest.fixture
def silent_producer() -> Iterator[Producer]:
    """A producer whose broker accepts connections and never answers: no report comes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{silent.getsockname()[1]}",
                             "message.timeout.ms": 60_000})  # fmt: skip
        yield producer
        producer.purge()
        producer.flush(0)


def test_a_broker_slow_to_acknowledge_does_not_hold_back_the_next_due_time(
    redis_server: RedisServer, silent_producer: Producer
) -> None:
    """Guarantee 6 (on time): with one batch sent and unacknowledged, fire_due returns in
    time for the next due message instead of waiting out the report deadline; the batch
    stays in flight, to be settled on a later run."""
    client = redis.Redis.from_url(redis_server.url)
    store = RedisStore(client, Keys(unique("ns")), grace_seconds=60)
    now = now_ms()
    first = Schedule("in:0:0", "orders", b"a", now - 1)
    second = Schedule("in:0:1", "orders", b"b", now + 1000)
    store.apply([IntakeSlice("in", 0, 1, [(0, first), (1, second)])], now)
    dispatcher = Dispatcher(store, Outbox(silent_producer, REPORT_WAIT_S), POLICY, Metrics())

    started = time.monotonic()
    fired = dispatcher.fire_due(threading.Event())
    waited_s = time.monotonic() - started

    assert fired.next_due_ms == second.due_ms
    assert waited_s < REPORT_WAIT_S / 4  # back by the next due time, not the report deadline
    assert store.counts() == (1, 1)  # the first is still in flight, unsettled
    client.close()

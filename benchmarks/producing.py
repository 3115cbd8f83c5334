"""Producing a load: records sent as fast as the client takes them."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

# How long to serve delivery reports when the producer's queue is full, before trying again.
FULL_QUEUE_WAIT_S = 0.01


def produce_waiting(producer: Producer, topic: str, value: bytes | None, **record: Any) -> None:
    """Produce one record (`record`: produce's key, headers, partition, ...), serving
    delivery reports while the producer's queue is full: a load generator sends faster than
    the broker takes."""
    while True:
        try:
            producer.produce(topic, value, **record)
            return
        except BufferError:
            producer.poll(FULL_QUEUE_WAIT_S)

"""The floor under S3: the least work intake must do per record, done in a plain loop.

Consume the intake topic, decode each value, store it as the design card does (the payload
with SET NX EX, the id in a sorted set with ZADD NX; commands packed with hiredis and sent
once per poll), and produce one answer per record (idempotent producer, failures reported
only). No envelope checks, no watermark, no callers' ids, no dead letters: whatever
blackbox spends beyond this loop is its own cost. Measured on the same stack and records
as S3, right after it, so a slow spell of the machine shows in both.
"""

from __future__ import annotations

import gc
import time
import uuid
from typing import Any

import hiredis
import orjson
import redis
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from benchmarks.stack import Stack, redis_cpu_seconds

POLL = 500
# Keys of their own, beside the service's: the floor never meets what blackbox stored.
PAYLOAD, DUE = "{floor}", "{floor}:due"
TTL_S = 3600 + 604_800


def intake_floor(stack: Stack, count: int) -> dict[str, float]:
    """Records/s of the plain loop over the first `count` intake records, and the CPU it
    and Redis spent per record."""
    loop = _Loop(stack)
    try:
        return loop.run(count)
    finally:
        loop.close()


class _Loop:
    """The floor's consumer, Redis connection and answer producer."""

    def __init__(self, stack: Stack) -> None:
        self.events = stack.settings.events_topic
        self.consumer = Consumer({"bootstrap.servers": stack.broker.bootstrap,
                                  "group.id": f"floor-{uuid.uuid4().hex[:8]}"})  # fmt: skip
        self.consumer.assign([TopicPartition(stack.settings.intake_topic, 0, 0)])
        self.answers = Producer({"bootstrap.servers": stack.broker.bootstrap, "linger.ms": 2,
                                 "enable.idempotence": True, "acks": "all",
                                 "delivery.report.only.error": True})  # fmt: skip
        self.client = redis.Redis.from_url(stack.redis.url)
        self.connection = self.client.connection_pool.get_connection()

    def run(self, count: int) -> dict[str, float]:
        gc.freeze()  # as the service does once started
        messages = self._first_poll()
        started, cpu = time.monotonic(), time.process_time()
        redis_cpu = redis_cpu_seconds(self.client)
        stored = 0
        while stored < count and messages:
            self._store(messages)
            self._answer(messages)
            stored += len(messages)
            messages = _records(self.consumer.consume(min(POLL, count - stored), timeout=5.0))
        self.answers.flush(30)
        elapsed = time.monotonic() - started
        redis_cpu = redis_cpu_seconds(self.client) - redis_cpu
        return {
            "records_per_s": round(stored / elapsed),
            "cpu_us_per_record": round((time.process_time() - cpu) / stored * 1e6, 1),
            "redis_cpu_us_per_record": round(redis_cpu / stored * 1e6, 1),
        }

    def _first_poll(self) -> list[Message]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            messages = _records(self.consumer.consume(POLL, timeout=1.0))
            if messages:
                return messages
        raise TimeoutError("the floor loop read nothing from the intake topic")

    def _store(self, messages: list[Message]) -> None:
        now = time.time_ns() // 1_000_000
        commands = []
        for message in messages:
            value = message.value() or b""
            countdown = orjson.loads(value)["countdown"]
            schedule_id = _id(message)
            commands.append(_pack("SET", PAYLOAD + schedule_id, value, "NX", "EX", TTL_S))
            commands.append(_pack("ZADD", DUE, "NX", now + int(countdown * 1000), schedule_id))
        self.connection.send_packed_command(commands)  # type: ignore[no-untyped-call]
        for _ in commands:
            self.connection.read_response()

    def _answer(self, messages: list[Message]) -> None:
        for message in messages:
            schedule_id = _id(message)
            answer = {"outcome": "scheduled", "blackbox_id": schedule_id}
            self.answers.produce(self.events, orjson.dumps(answer), schedule_id.encode())
        self.answers.poll(0)

    def close(self) -> None:
        self.client.connection_pool.release(self.connection)
        self.client.close()
        self.consumer.close()


def _records(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.error() is None]


def _id(message: Message) -> str:
    return f"{message.topic()}:{message.partition()}:{message.offset()}"


def _pack(*command: Any) -> bytes:
    packed: bytes = hiredis.pack_command(command)
    return packed

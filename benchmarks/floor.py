"""The floors under S3 and S1: the least work intake must do per record, and firing per
message, each done in a plain loop.

Intake (`intake_floor`): consume the intake topic, decode each value, store it as the
design card does (the payload with SET NX EX, the id in a sorted set with ZADD NX; commands
packed with hiredis and sent once per poll), and produce one answer per record (idempotent
producer, failures reported only). No envelope checks, no watermark, no callers' ids, no
dead letters: whatever blackbox spends beyond this loop is its own cost. Measured on the
same stack and records as S3, right after it, so a slow spell of the machine shows in both.

Firing (`firing_floor`): as many ids, all due, claimed 500 at a time by a Lua script that
moves them to an in-flight set and returns their payloads; each produced to its topic with
its id as key and as a header (idempotent producer, acks=all, no linger); a delivery report
awaited for each; then the reported ids acknowledged by a second script (ZREM, DEL). No
leases, shards, attempts, retries, series or metrics: what S1 spends beyond this loop is
blackbox's own cost.
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
        meter = _Meter(self.client)
        stored = 0
        while stored < count and messages:
            self._store(messages)
            self._answer(messages)
            stored += len(messages)
            messages = _records(self.consumer.consume(min(POLL, count - stored), timeout=5.0))
        self.answers.flush(30)
        return meter.figures(stored, "record")

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


CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[1], id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('GET', KEYS[3] .. id)
end
return out
"""
ACK = """
for _, id in ipairs(ARGV) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('DEL', KEYS[2] .. id)
end
return #ARGV
"""
IN_FLIGHT = "{floor}:fly"
# How long the firing loop waits for one claim's delivery reports.
REPORT_SECONDS = 30.0


class _Meter:
    """Both floors' figures, measured one way: wall time, this process's CPU (librdkafka's
    threads included) and Redis's, from its making to `figures`."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.started, self.cpu = time.monotonic(), time.process_time()
        self.redis_cpu = redis_cpu_seconds(client)

    def figures(self, count: int, unit: str) -> dict[str, float]:
        """`<unit>s_per_s`, `cpu_us_per_<unit>` and `redis_cpu_us_per_<unit>` over `count`."""
        elapsed = time.monotonic() - self.started
        cpu = time.process_time() - self.cpu
        redis_cpu = redis_cpu_seconds(self.client) - self.redis_cpu
        return {
            f"{unit}s_per_s": round(count / elapsed),
            f"cpu_us_per_{unit}": round(cpu / count * 1e6, 1),
            f"redis_cpu_us_per_{unit}": round(redis_cpu / count * 1e6, 1),
        }


def firing_floor(stack: Stack, topic: str, count: int, value: bytes) -> dict[str, float]:
    """Messages/s of the plain firing loop over `count` ids due now, each delivering `value`
    to `topic` (created already), and the CPU it and Redis spent per message."""
    client = redis.Redis.from_url(stack.redis.url)
    producer = Producer({"bootstrap.servers": stack.broker.bootstrap, "linger.ms": 0,
                         "enable.idempotence": True, "acks": "all"})  # fmt: skip
    try:
        return _FiringLoop(client, producer, topic).run(count, value)
    finally:
        producer.flush(10)
        client.close()


class _FiringLoop:
    def __init__(self, client: redis.Redis, producer: Producer, topic: str) -> None:
        self.client, self.producer, self.topic = client, producer, topic
        self.claim = client.register_script(CLAIM)
        self.ack = client.register_script(ACK)
        self.acked: list[bytes] = []
        self.reported = 0

    def run(self, count: int, value: bytes) -> dict[str, float]:
        now = time.time_ns() // 1_000_000
        pipe = self.client.pipeline(transaction=False)
        for n in range(count):
            pipe.set(f"{PAYLOAD}f{n}", value, ex=TTL_S)
            pipe.zadd(DUE, {f"f{n}": now})
        pipe.execute()
        gc.freeze()
        meter = _Meter(self.client)
        fired = 0
        while fired < count:
            fired += self._fire(now)
        return meter.figures(fired, "message")

    def _fire(self, now: int) -> int:
        claimed: list[bytes] = self.claim(keys=[DUE, IN_FLIGHT, PAYLOAD], args=[now, POLL])
        ids, payloads = claimed[0::2], claimed[1::2]
        for schedule_id, payload in zip(ids, payloads, strict=True):
            self.producer.produce(
                self.topic,
                payload,
                schedule_id,
                headers=[("blackbox-id", schedule_id)],
                on_delivery=self._report,
            )
        deadline = time.monotonic() + REPORT_SECONDS
        while self.reported < len(ids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(ids) - self.reported} delivery reports never came")
            self.producer.poll(0.05)
        acked, self.acked, self.reported = self.acked, [], 0
        if acked:
            self.ack(keys=[IN_FLIGHT, PAYLOAD], args=acked)
        return len(acked)

    def _report(self, error: object, message: Message) -> None:
        self.reported += 1
        if error is None:
            self.acked.append(message.key() or b"")


def _records(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.error() is None]


def _id(message: Message) -> str:
    return f"{message.topic()}:{message.partition()}:{message.offset()}"


def _pack(*command: Any) -> bytes:
    packed: bytes = hiredis.pack_command(command)
    return packed

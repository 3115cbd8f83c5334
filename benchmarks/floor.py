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

Burst (`burst_floor`): the firing loop in as many OS processes as blackbox's burst has, each
over its own share of the ids on keys of its own (one hash tag per process: on a Redis
Cluster each process's keys share a slot, the processes' slots on different masters in
turn). Every share is stored first; then all loops start at one instant, and the floor is the
time from it until every process has acknowledged all its ids.
"""

from __future__ import annotations

import gc
import multiprocessing
import queue
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from threading import BrokenBarrierError
from typing import Any

import hiredis
import orjson
import redis
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from redis.cluster import RedisCluster

from benchmarks.readings import redis_cpu
from benchmarks.stack import Stack
from blackbox.storage.connections import RedisClient, redis_client

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
FILL_BATCH = 10_000  # ids stored per pipeline
# How long the burst floor waits for its processes to store their shares, and to fire them.
BURST_FILL_SECONDS = 600.0
BURST_FIRE_SECONDS = 600.0


@dataclass(frozen=True)
class _Keys:
    """One firing loop's keys, all under one hash tag: the ids due, those in flight, and
    the prefix of the payloads' keys."""

    due: str
    in_flight: str
    payload: str

    @classmethod
    def tagged(cls, tag: str) -> _Keys:
        return cls(f"{{{tag}}}:due", f"{{{tag}}}:fly", f"{{{tag}}}")


FLOOR_KEYS = _Keys(DUE, IN_FLIGHT, PAYLOAD)


def _per(count: int, unit: str, seconds: float, cpu: float, redis_s: float) -> dict[str, float]:
    """`<unit>s_per_s`, `cpu_us_per_<unit>` and `redis_cpu_us_per_<unit>` over `count`."""
    return {
        f"{unit}s_per_s": round(count / seconds),
        f"cpu_us_per_{unit}": round(cpu / count * 1e6, 1),
        f"redis_cpu_us_per_{unit}": round(redis_s / count * 1e6, 1),
    }


class _Meter:
    """The floors' figures, measured one way: wall time, this process's CPU (librdkafka's
    threads included) and Redis's (every master's), from its making to `figures`."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self.started, self.cpu = time.monotonic(), time.process_time()
        self.redis_cpu = redis_cpu(client)

    def figures(self, count: int, unit: str) -> dict[str, float]:
        """`<unit>s_per_s`, `cpu_us_per_<unit>` and `redis_cpu_us_per_<unit>` over `count`."""
        elapsed = time.monotonic() - self.started
        cpu = time.process_time() - self.cpu
        return _per(count, unit, elapsed, cpu, redis_cpu(self.client) - self.redis_cpu)


def firing_floor(stack: Stack, topic: str, count: int, value: bytes) -> dict[str, float]:
    """Messages/s of the plain firing loop over `count` ids due now, each delivering `value`
    to `topic` (created already), and the CPU it and Redis spent per message."""
    client = redis.Redis.from_url(stack.redis.url)
    producer = _firing_producer(stack.broker.bootstrap)
    try:
        return _FiringLoop(client, producer, topic).run(count, value)
    finally:
        producer.flush(10)
        client.close()


def _firing_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                     "enable.idempotence": True, "acks": "all"})  # fmt: skip


class _FiringLoop:
    def __init__(
        self, client: RedisClient, producer: Producer, topic: str, keys: _Keys = FLOOR_KEYS
    ) -> None:
        self.client, self.producer, self.topic, self.keys = client, producer, topic, keys
        self.claim = client.register_script(CLAIM)
        self.ack = client.register_script(ACK)
        self.acked: list[bytes] = []
        self.reported = 0

    def run(self, count: int, value: bytes) -> dict[str, float]:
        now = self.fill(count, value)
        gc.freeze()
        meter = _Meter(self.client)
        fired = self.fire(count, now)
        return meter.figures(fired, "message")

    def fill(self, count: int, value: bytes) -> int:
        """Store `count` ids due now with `value` as their payload; the instant they are due."""
        now = time.time_ns() // 1_000_000
        for start in range(0, count, FILL_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for n in range(start, min(start + FILL_BATCH, count)):
                pipe.set(f"{self.keys.payload}f{n}", value, ex=TTL_S)
                pipe.zadd(self.keys.due, {f"f{n}": now})
            pipe.execute()
        return now

    def fire(self, count: int, now: int) -> int:
        """Claim, produce and acknowledge until `count` ids are acknowledged."""
        fired = 0
        while fired < count:
            fired += self._fire(now)
        return fired

    def _fire(self, now: int) -> int:
        keys = [self.keys.due, self.keys.in_flight, self.keys.payload]
        claimed: list[bytes] = self.claim(keys=keys, args=[now, POLL])
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
            self.ack(keys=[self.keys.in_flight, self.keys.payload], args=acked)
        return len(acked)

    def _report(self, error: object, message: Message) -> None:
        self.reported += 1
        if error is None:
            self.acked.append(message.key() or b"")


def burst_floor(  # noqa: PLR0913, PLR0917 - the firing floor's parts, and how many processes
    redis_url: str, bootstrap: str, topic: str, count: int, processes: int, value: bytes
) -> dict[str, float]:
    """The firing loop in `processes` OS processes over `count` ids in all, each delivering
    `value` to `topic` (created already): every share stored first, then all started at one
    instant. The time from it until the last process acknowledged its last id, messages/s
    over it, and the CPU the processes (summed) and Redis (every master) spent per message."""
    client = redis_client(redis_url)
    context = multiprocessing.get_context("spawn")
    ready, go = context.Barrier(processes + 1), context.Event()
    done: Queue[_Fired | str] = context.Queue()
    counts = [count // processes + (p < count % processes) for p in range(processes)]
    shares = [
        _Share(redis_url, bootstrap, topic, tag, n, value)
        for tag, n in zip(_tags(client, processes), counts, strict=True)
    ]
    workers = [
        context.Process(target=_burst_share, args=(share, ready, go, done), name=f"floor-{p}")
        for p, share in enumerate(shares)
    ]
    try:
        for worker in workers:
            worker.start()
        try:
            ready.wait(BURST_FILL_SECONDS)
        except BrokenBarrierError:
            raise SystemExit(f"the burst floor: a process did not store its share: "
                             f"{_reason(done)}") from None  # fmt: skip
        redis_before = redis_cpu(client)
        started = time.monotonic()
        go.set()
        fired = [_result(done) for _ in workers]
        seconds = max(f.finished for f in fired) - started
        redis_s = redis_cpu(client) - redis_before
    except BaseException:
        for worker in workers:  # those waiting for the start would wait for good
            if worker.is_alive():
                worker.terminate()
        raise
    finally:
        _stop(workers)
        client.close()
    if sum(f.count for f in fired) != count:
        raise SystemExit(f"the burst floor acknowledged {sum(f.count for f in fired)} of {count}")
    return {
        "last_after_start_ms": round(seconds * 1000),
        **_per(count, "message", seconds, sum(f.cpu for f in fired), redis_s),
        "processes": processes,
    }


@dataclass(frozen=True)
class _Fired:
    """One burst floor process's share done: ids acknowledged, CPU spent firing them, and
    when it finished (time.monotonic, one clock for every process of the machine)."""

    count: int
    cpu: float
    finished: float


@dataclass(frozen=True)
class _Share:
    """One burst floor process's part: where it fires, its keys' hash tag, its ids."""

    redis_url: str
    bootstrap: str
    topic: str
    tag: str
    count: int
    value: bytes


def _burst_share(share: _Share, ready: Barrier, go: Event, done: Queue[_Fired | str]) -> None:
    """One burst floor process: store its share, wait for the start, fire the share."""
    try:
        client = redis_client(share.redis_url)
        producer = _firing_producer(share.bootstrap)
        producer.list_topics(share.topic, timeout=10)  # connected, the topic known, at the start
        loop = _FiringLoop(client, producer, share.topic, _Keys.tagged(share.tag))
        now = loop.fill(share.count, share.value)
        gc.freeze()
        ready.wait(BURST_FILL_SECONDS)
        go.wait()
        cpu = time.process_time()
        fired = loop.fire(share.count, now)
        done.put(_Fired(fired, time.process_time() - cpu, time.monotonic()))
        producer.flush(10)
        client.close()
    except BaseException as e:
        ready.abort()  # the parent stops waiting for the fill
        done.put(f"{type(e).__name__}: {e}")
        raise


def _result(done: Queue[_Fired | str]) -> _Fired:
    try:
        fired = done.get(timeout=BURST_FIRE_SECONDS)
    except queue.Empty:
        raise SystemExit(f"the burst floor: a process not done in {BURST_FIRE_SECONDS} s") from None
    if isinstance(fired, str):
        raise SystemExit(f"the burst floor: a process failed: {fired}")
    return fired


def _reason(done: Queue[_Fired | str]) -> str:
    try:
        return str(done.get(timeout=5))
    except queue.Empty:
        return "none given (timed out, or the process died)"


def _stop(workers: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for worker in workers:
        if worker.pid is not None:
            worker.join(30)
        if worker.is_alive():
            worker.terminate()
            worker.join(10)


def _tags(client: RedisClient, processes: int) -> list[str]:
    """One hash tag per process; on a Redis Cluster, the tags' slots on its masters in turn."""
    if not isinstance(client, RedisCluster):
        return [f"floor{p}" for p in range(processes)]
    masters = sorted(node.name for node in client.get_primaries())  # type: ignore[no-untyped-call]
    tags: list[str] = []
    n = 0
    for p in range(processes):
        while _master_of(client, f"{{floor{n}}}") != masters[p % len(masters)]:
            n += 1
        tags.append(f"floor{n}")
        n += 1
    return tags


def _master_of(client: RedisCluster, key: str) -> str:
    node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]  # unannotated in redis-py
    name: str = node.name
    return name


def _records(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.error() is None]


def _id(message: Message) -> str:
    return f"{message.topic()}:{message.partition()}:{message.offset()}"


def _pack(*command: Any) -> bytes:
    packed: bytes = hiredis.pack_command(command)
    return packed

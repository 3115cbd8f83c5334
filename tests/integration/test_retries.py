"""Issue 51: a consumer's failed record comes back later, byte for byte, after its backoff,
on its partition, its attempt counted; after the last attempt it is on the dead-letter
topic with every error; a retry sent twice (a consumer killed before its commit) is
scheduled once. Records are written by Debian's kcat (binary key, non-UTF-8 header values),
consumed by a real group consumer, retried with `Client.retry`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from blackbox import retries
from blackbox.client import Client
from blackbox.envelope import CALLER_HEADER, normalize_headers
from blackbox.intake import rebuild
from blackbox.kafka import clients
from blackbox.service import Service
from tests.integration.conftest import ReaderFactory, ServiceFactory, wipe_namespace
from tests.kafkatools import END_MARKER_KEY, Received, produce, produce_to, unique, wait_until

pytestmark = pytest.mark.both_store_modes  # the storage-touching tests: both modes

Seen = tuple[str, int]  # a record's name and the attempt it came as
KEY_END = "@@bb-key@@"
RECORD_END = "@@bb-record@@"
PARTITIONS = 3
DELAYS = [1, 2]  # seconds after the first and the second failure: three attempts in all
CALLER = "orders-worker"
# Each record: its key, value and header arguments as kcat writes them (-H name=value).
RECORDS = {
    "flaky": (b"k\x00\xff1", b"\x00flaky\xff", [b"trace=\xff\xfe", b"kind=a", b"kind=b", b"n"]),
    "broken": (b"k\x00\xff2", b"\x00broken\xfe", [b"trace=\x80", b"empty="]),
    "fine": (b"k3", b"fine", [b"kind=c"]),
}


def kcat_produce(
    bootstrap: str, topic: str, key: bytes, value: bytes, headers: list[bytes]
) -> None:
    """One record written by kcat, placed by the key's murmur2 partition as Java's would."""
    args = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", KEY_END, "-D", RECORD_END,
            "-X", "partitioner=murmur2_random"]  # fmt: skip
    for header in headers:
        args += ["-H", header]  # type: ignore[list-item] # bytes reach argv as they are
    subprocess.run(args, input=key + KEY_END.encode() + value + RECORD_END.encode(),
                   check=True, timeout=30)  # fmt: skip


def group_consumer(bootstrap: str, topic: str, group: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([topic])
    return consumer


@dataclass(frozen=True)
class Raw:
    """A record as Kafka holds it: headers in order, repeats kept."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def read_raw(bootstrap: str, topic: str, count: int, timeout: float = 30) -> list[Raw]:
    """The first `count` records of `topic`, from every partition, in partition order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("raw"),
                         "enable.auto.commit": False})  # fmt: skip
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    got: list[Raw] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for m in consumer.consume(100, timeout=0.2):
            if m.error() is None and m.key() != END_MARKER_KEY:
                got.append(Raw(m.partition() or 0, m.offset() or 0, m.key(), m.value(),
                               normalize_headers(m.headers())))  # fmt: skip
    consumer.close()
    assert len(got) >= count, f"{len(got)} of {count} records on {topic}"
    return sorted(got, key=lambda r: (r.partition, r.offset))


def name_of(value: bytes | None) -> str:
    return next(name for name, (_, v, _) in RECORDS.items() if v == value)


def attempt_of(message: Message | Received) -> int:
    headers = dict(message.headers() or []) if isinstance(message, Message) else message.headers
    raw = headers.get(retries.ATTEMPT_HEADER)
    return 1 if raw is None else int(raw)


def consume_failing(service: Service, topic: str, done: Callable[[], bool]) -> list[Seen]:
    """Process `topic` as a worker would: `flaky` fails on its first attempt, `broken`
    always, `fine` never; each failure is retried, the offset committed after the retry
    was acknowledged. Returns what was processed (name, attempt) until `done()`, then for
    one second more (nothing else may come)."""
    bootstrap = service.settings.kafka["bootstrap.servers"]
    consumer = group_consumer(bootstrap, topic, unique("workers"))
    seen: list[Seen] = []
    producer = {"bootstrap.servers": bootstrap}
    deadline, after = time.monotonic() + 60, None
    with Client(producer, caller=CALLER, intake_topic=service.settings.intake_topic) as client:
        while after is None or time.monotonic() < after:
            assert time.monotonic() < deadline, f"still not done after 60 s: {seen}"
            if after is None and done():
                after = time.monotonic() + 1
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            name, attempt = name_of(message.value()), attempt_of(message)
            seen.append((name, attempt))
            if name == "broken" or (name == "flaky" and attempt == 1):
                client.retry(message, f"{name} failed at attempt {attempt}",
                             policy={"delays": DELAYS})  # fmt: skip
                client.flush()
            consumer.commit(message=message, asynchronous=False)
    consumer.close()
    return seen


def test_failed_records_come_back_byte_for_byte_then_go_to_the_dead_letter_topic(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    service = start_service()
    bootstrap = service.settings.kafka["bootstrap.servers"]
    topic = unique("orders")
    clients.ensure_topics(service.settings.kafka, [topic, f"{topic}.dlq"], partitions=PARTITIONS)
    for key, value, headers in RECORDS.values():
        kcat_produce(bootstrap, topic, key, value, headers)
    assert len({r.partition for r in read_raw(bootstrap, topic, 3)}) > 1  # keys spread out

    dead = reader(f"{topic}.dlq")

    def dead_lettered() -> bool:
        dead.poll(0)
        return bool(dead.records)

    seen = consume_failing(service, topic, done=dead_lettered)
    attempts = sorted(seen)
    assert attempts == [("broken", 1), ("broken", 2), ("broken", 3), ("fine", 1),
                        ("flaky", 1), ("flaky", 2)]  # fmt: skip

    raw = read_raw(bootstrap, topic, 6)  # 3 records, flaky once again, broken twice again
    assert len(reader(topic).read_to_end()) == 6  # and no more
    firsts = {name_of(r.value): r for r in raw if retries.ATTEMPT_HEADER not in dict(r.headers)}
    for record in raw:
        original = firsts[name_of(record.value)]
        assert (record.key, record.value, record.partition) == (
            original.key, original.value, original.partition)  # fmt: skip
        own = record.headers[: len(original.headers)]
        assert own == original.headers  # in order, repeats and empty values kept
        added = dict(record.headers[len(own) :])
        assert all(name.startswith("blackbox-") or name == CALLER_HEADER for name in added)
        if retries.ATTEMPT_HEADER in added:
            attempt = int(added[retries.ATTEMPT_HEADER] or b"")
            assert (
                added[retries.OF_HEADER]
                == f"{topic}/{original.partition}/{original.offset}".encode()
            )
            history = orjson.loads(added[retries.HISTORY_HEADER] or b"")
            assert [f["attempt"] for f in history] == list(range(1, attempt))
    for received in reader(topic).records:  # the delay kept: created after the failure's
        if retries.HISTORY_HEADER in received.headers:
            history = orjson.loads(received.headers[retries.HISTORY_HEADER] or b"")
            waited = received.created_ms - history[-1]["at_ms"]
            assert waited >= DELAYS[len(history) - 1] * 1000 - 5, (waited, history)

    [letter] = read_raw(bootstrap, f"{topic}.dlq", 1)
    assert len(dead.read_to_end()) == 1
    broken = firsts["broken"]
    assert (letter.key, letter.value) == (broken.key, broken.value)
    assert letter.headers[:2] == [("trace", b"\x80"), ("empty", b"")]
    history = orjson.loads(dict(letter.headers)[retries.HISTORY_HEADER] or b"")
    assert [f["error"] for f in history] == [f"broken failed at attempt {n}" for n in (1, 2, 3)]
    assert history[0]["at_ms"] < history[1]["at_ms"] < history[2]["at_ms"]
    assert dict(letter.headers)[retries.ATTEMPT_HEADER] == b"3"
    scheduled = service.metrics.value("blackbox_retries_scheduled_total", {"topic": topic})
    exhausted = service.metrics.value("blackbox_retries_exhausted_total", {"topic": f"{topic}.dlq"})
    assert (scheduled, exhausted) == (3, 1)


# A worker that sends the retry of the first record it reads, then dies before committing.
_KILLED_WORKER = """
import os, signal, sys
from confluent_kafka import Consumer
from blackbox.client import Client
from blackbox.intake import rebuild
from blackbox.envelope import CALLER_HEADER, normalize_headers
bootstrap, topic, group, intake = sys.argv[1:5]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
consumer.subscribe([topic])
message = None
while message is None or message.error() is not None:
    message = consumer.poll(1.0)
client = Client({"bootstrap.servers": bootstrap}, caller=sys.argv[5], intake_topic=intake)
client.retry(message, "timeout", policy={"delays": [3]})
client.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_worker_killed_between_its_retry_and_its_commit_retries_once(
    start_service: ServiceFactory, reader: ReaderFactory, tmp_path: Path
) -> None:
    service = start_service()
    bootstrap = service.settings.kafka["bootstrap.servers"]
    topic, group = unique("orders"), unique("workers")
    clients.ensure_topics(service.settings.kafka, [topic])
    kcat_produce(bootstrap, topic, b"k\xff", b"\x00once", [b"h=\xfe"])
    events = reader(service.settings.events_topic)
    script = tmp_path / "worker.py"
    script.write_text(_KILLED_WORKER)
    args = [sys.executable, str(script), bootstrap, topic, group, service.settings.intake_topic,
            CALLER]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    for _ in range(2):  # killed twice before any commit: the same record read twice
        done = subprocess.run(args, env=env, timeout=60, check=False)
        assert done.returncode == -9

    def answers() -> list[str]:
        return [orjson.loads(e.value or b"")["outcome"] for e in events.records
                if orjson.loads(e.value or b"").get("id") == f"retry/{topic}/0/0/2"]  # fmt: skip

    events.wait_for(lambda _: len(answers()) == 2)
    first, again = answers()  # again: still pending, or fired already; never scheduled twice
    assert first == "scheduled" and again in ("already_pending", "already_fired")
    [retried] = reader(topic).wait_for(lambda records: len(records) >= 2, timeout=20)[1:]
    assert (retried.key, retried.value, retried.headers["h"]) == (b"k\xff", b"\x00once", b"\xfe")
    wait_until(lambda: service.metrics.value("blackbox_delivered_total") >= 1, what="delivered")
    assert len(reader(topic).read_to_end()) == 2  # the original and one retry, no second


def test_the_python_example_consumer_retries_a_failure_once_byte_for_byte(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """examples/python/retry_consumer.py as the Retries page shows it: each record fails
    its first attempt and comes back once, after 1 s, as it was written."""
    service = start_service()
    bootstrap = service.settings.kafka["bootstrap.servers"]
    topic = unique("orders")
    clients.ensure_topics(service.settings.kafka, [topic], partitions=PARTITIONS)
    key, value, headers = RECORDS["flaky"]
    kcat_produce(bootstrap, topic, key, value, headers)
    script = Path(__file__).parents[2] / "examples" / "python" / "retry_consumer.py"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
           "BLACKBOX_INTAKE_TOPIC": service.settings.intake_topic}  # fmt: skip
    done = subprocess.run([sys.executable, str(script), topic, "8"], env=env, timeout=60,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "failed: the inventory service" in lines[0], lines
    assert lines[1].endswith(" ok")
    original, retried = read_raw(bootstrap, topic, 2)
    assert (retried.key, retried.value, retried.partition) == (key, value, original.partition)
    assert original.headers == [("trace", b"\xff\xfe"), ("kind", b"a"), ("kind", b"b"), ("n", None)]
    own = retried.headers[: len(original.headers)]
    assert own == original.headers
    assert dict(retried.headers[len(own) :])[retries.ATTEMPT_HEADER] == b"2"


def test_a_rebuild_keeps_the_pending_retry_and_delivers_none_again(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """Redis lost and rebuilt from Kafka: a retry already delivered to its topic, and one
    dead-lettered past its last attempt, are passed over (the replay reads the topics
    they went to); the one still waiting is written back, once."""
    service = start_service()
    bootstrap = service.settings.kafka["bootstrap.servers"]
    topic = unique("orders")
    clients.ensure_topics(service.settings.kafka, [topic, f"{topic}.dlq"])
    caller = (CALLER_HEADER, CALLER.encode())
    for offset, delays, seen in [(1, "[0]", ()), (2, "[600]", ()),
                                 (3, "[1]", ((retries.OF_HEADER, f"{topic}/0/3".encode()),
                                             (retries.ATTEMPT_HEADER, b"2")))]:  # fmt: skip
        headers = [caller, (retries.ERROR_HEADER, b"e"), *seen,
                   (retries.SOURCE_HEADER, f"{topic}/0/{offset}".encode()),
                   (retries.POLICY_HEADER, f'{{"delays": {delays}}}'.encode())]  # fmt: skip
        produce(bootstrap, service.settings.intake_topic, [f"r{offset}".encode()], headers)
    reader(topic).wait_count(1)
    reader(f"{topic}.dlq").wait_count(1)
    wait_until(lambda: service.metrics.value("blackbox_delivered_total") >= 2, what="delivered")
    service.stop()
    wipe_namespace(redis_client, service.settings.namespace)
    counts = rebuild.rebuild(service.settings)
    due = [redis_client.zrange(k.due, 0, -1) for k in service.store.layout.shards]
    pending = {bytes(i).decode() for ids in due for i in ids}  # type: ignore[arg-type]
    assert pending == {f"@{CALLER}/retry/{topic}/0/2/2"}, (pending, counts)
    start_service()
    assert [r.value for r in reader(topic).read_to_end()] == [b"r1"]
    assert [r.value for r in reader(f"{topic}.dlq").read_to_end()] == [b"r3"]


def test_partition_same_brings_a_keyless_record_back_to_its_partition(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """A record without a key has no partition of its own to go back to: with
    `"partition": "same"` each retry is delivered to the partition it was first read from."""
    service = start_service()
    bootstrap = service.settings.kafka["bootstrap.servers"]
    topic = unique("orders")
    clients.ensure_topics(service.settings.kafka, [topic], partitions=PARTITIONS)
    produce_to(bootstrap, topic, [(p, None, f"keyless-{p}".encode()) for p in range(PARTITIONS)])
    firsts = read_raw(bootstrap, topic, PARTITIONS)
    consumer = group_consumer(bootstrap, topic, unique("workers"))
    policy = {"delays": [0.2, 0.2], "partition": "same"}
    retried = 0
    with Client({"bootstrap.servers": bootstrap}, caller=CALLER,
                intake_topic=service.settings.intake_topic) as client:  # fmt: skip
        deadline = time.monotonic() + 30
        while retried < PARTITIONS * 2 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error() is not None or attempt_of(message) > 2:
                continue
            client.retry(message, "keyless", policy=policy)
            client.flush()
            retried += 1
    consumer.close()
    everything = read_raw(bootstrap, topic, PARTITIONS * 3)
    assert len(reader(topic).read_to_end()) == PARTITIONS * 3
    for record in everything:
        first = next(f for f in firsts if f.value == record.value)
        assert (record.partition, record.key) == (first.partition, None)

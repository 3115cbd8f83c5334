"""Records any Kafka client can write, written by Debian's kcat (Python's client cannot write
most of them): each is dead-lettered with a reason or scheduled, never a crash, never a
stuck partition; and a record that kills the intake anyway is dead-lettered after a few
deaths instead of stopping every replica in turn."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from blackbox import envelope as envelope_module
from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason
from blackbox.intake.batch import Batch
from blackbox.intake.crashguard import CRASH_LIMIT
from blackbox.intake.loop import Intake
from blackbox.kafka import clients
from blackbox.service import Service
from blackbox.settings import Settings
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import envelope, unique, wait_until

_R = DeadLetterReason
# Delimiters no record below contains, so kcat reads keys and values as raw bytes.
KEY_END = "@@bb-key@@"
RECORD_END = "@@bb-record@@"
CALLER = f"{CALLER_HEADER}=billing".encode()
# Larger than librdkafka's default message.max.bytes (1,000,000), within the broker's
# 1,048,588: the dead-letter copy is refused for its size and sent without its value.
AT_THE_BROKERS_LIMIT = 1_048_000
# Nine headers of 115,000 bytes (one argument of kcat's may hold 128 KiB): the record's
# headers alone are too large for the dead-letter producer.
HUGE_HEADERS = [f"big{i}=".encode() + b"x" * 115_000 for i in range(9)]


@dataclass(frozen=True)
class Hostile:
    """One record for kcat: its value (None: a tombstone), key and raw header arguments."""

    name: str
    value: bytes | None
    key: bytes | None
    headers: Sequence[bytes]
    expected: DeadLetterReason | None  # None: scheduled and delivered


def kcat_produce(bootstrap: str, topic: str, record: Hostile) -> None:
    """Write one record with kcat to partition 0, exactly as given."""
    args = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", "0", "-K", KEY_END, "-D",
            RECORD_END, "-Z", "-X", "message.max.bytes=2000000"]  # fmt: skip
    for header in record.headers:
        args += ["-H", header]  # type: ignore[list-item] # bytes reach argv as they are
    line = (record.key or b"") + KEY_END.encode() + (record.value or b"") + RECORD_END.encode()
    subprocess.run(args, input=line, check=True, timeout=30)


def _cases(target: str) -> list[Hostile]:
    good = envelope(target, {"hostile": True}, 0)
    many = [f"h{i}=v{i}".encode() for i in range(3000)]
    return [
        Hostile("header name not UTF-8", good, None, [b"\xff\xfe=v", CALLER], _R.INVALID_HEADER),
        Hostile("header value not UTF-8", good, None, [b"trace=\xff\xfe", CALLER], None),
        Hostile("caller not UTF-8", good, None, [f"{CALLER_HEADER}=".encode() + b"\xff\xfe"],
                _R.INVALID_HEADER),
        Hostile("caller twice", good, None, [CALLER, f"{CALLER_HEADER}=other".encode()],
                _R.INVALID_HEADER),
        Hostile("caller without value", good, None, [CALLER_HEADER.encode()], _R.INVALID_HEADER),
        Hostile("header without value", good, None, [b"flag", CALLER], None),
        Hostile("3,000 headers", good, None, [*many, CALLER], None),
        Hostile("3,000 headers, not JSON", b"{not json", None, [*many, CALLER], _R.INVALID_JSON),
        Hostile("binary key", good, b"\x00\xff\xfe", [CALLER], None),
        Hostile("tombstone, binary key", None, b"\xff\xfe", [CALLER], _R.INVALID_ID),
        Hostile("tombstone without key", None, None, [CALLER], _R.EMPTY_VALUE),
        Hostile("value at the broker's size limit", b"x" * AT_THE_BROKERS_LIMIT, None, [CALLER],
                _R.INVALID_JSON),
        Hostile("1 MB of headers, not JSON", b"{not json", b"k", [*HUGE_HEADERS, CALLER],
                _R.INVALID_JSON),
    ]  # fmt: skip


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (position,) = consumer.committed([TopicPartition(topic, 0)], timeout=5)
        return int(position.offset)
    finally:
        consumer.close()


def test_every_record_a_kafka_client_can_write_is_handled(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 4: headers in any bytes, repeated or value-less, thousands of headers, binary
    keys, tombstones without keys, a value at the broker's limit, each written by kcat
    between good records: each is dead-lettered with its reason (its value and key copied)
    or scheduled, every good record is delivered byte for byte, the offsets are committed
    past all of them and the service is alive."""
    service = start_service()
    settings = service.settings
    bootstrap = settings.kafka["bootstrap.servers"]
    target = unique("hostile")
    cases = _cases(target)
    sent_good: list[bytes] = []
    for n, case in enumerate(cases):
        before = envelope(target, {"n": n}, 0)
        kcat_produce(
            bootstrap, settings.intake_topic, Hostile("good", before, None, [CALLER], None)
        )
        kcat_produce(bootstrap, settings.intake_topic, case)
        sent_good.append(before)
    last = envelope(target, {"n": "last"}, 0)
    kcat_produce(bootstrap, settings.intake_topic, Hostile("good", last, None, [CALLER], None))
    sent_good.append(last)
    refused = [c for c in cases if c.expected is not None]
    scheduled = [c for c in cases if c.expected is None]

    dlq_reader, target_reader = reader(settings.dlq_topic), reader(target)
    dead = dlq_reader.wait_count(len(refused), timeout=60)
    delivered = target_reader.wait_count(len(sent_good) + len(scheduled), timeout=60)
    settle(service)

    assert [d.header("blackbox-dlq-reason") for d in dead] == [c.expected for c in refused]
    too_large = {"value at the broker's size limit", "1 MB of headers, not JSON"}
    for letter, case in zip(dead, refused, strict=True):
        assert letter.key == case.key, case.name
        assert letter.value == (None if case.name in too_large else case.value), case.name
    assert dead[0].header("blackbox-dlq-headers-omitted") == "unreadable"
    assert dead[-2].header("blackbox-dlq-value-omitted") == f"{AT_THE_BROKERS_LIMIT} bytes"
    assert dead[-1].header("blackbox-dlq-headers-omitted").startswith("too large")
    assert "big0" not in dead[-1].headers
    assert dead[-1].header("blackbox-dlq-reason") == _R.INVALID_JSON
    expected_values = [orjson.loads(v)["message"] for v in sent_good]
    expected_values += [{"hostile": True}] * len(scheduled)
    got = [orjson.loads(r.value or b"") for r in delivered]
    assert sorted(map(orjson.dumps, got)) == sorted(map(orjson.dumps, expected_values))
    assert all(r.header(CALLER_HEADER) == "billing" for r in delivered)
    total = 2 * len(cases) + 1
    wait_until(
        lambda: _committed(bootstrap, settings.group_id, settings.intake_topic) == total,
        what="intake offsets committed past every record",
    )
    assert not service.failed
    invalid_header = {"reason": "invalid_header"}
    assert service.metrics.value("blackbox_dead_letters_total", invalid_header) == 4


POISON = b"POISON"


class InjectedCrash(RuntimeError):
    """Stands for whatever kills an intake thread on a record (native code, a bug)."""


@pytest.fixture
def crashing_on_poison(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every intake poll holding the POISON record dies, unless the guard set it aside."""
    crashes: list[int] = []
    apply = Intake._apply_in_parts

    def dying(
        self: Intake, records: Sequence[Message], now: int, batch: Batch,
        stop: object,
    ) -> object:  # fmt: skip
        for m in records:
            where = (m.topic() or "", m.partition() or 0, m.offset() or 0)
            if m.value() == POISON and where not in batch.poisoned:
                crashes.append(m.offset() or 0)
                raise InjectedCrash("the intake died on a record")
        return apply(self, records, now, batch, stop)  # type: ignore[arg-type]

    monkeypatch.setattr(Intake, "_apply_in_parts", dying)
    yield crashes


def test_a_record_that_kills_the_intake_is_dead_lettered_after_a_few_deaths(
    env: dict[str, str], reader: ReaderFactory, crashing_on_poison: list[int]
) -> None:
    """Guarantee 4: a record whose handling kills the intake thread is not a loop of crashes
    across the group: each new owner takes the offsets its predecessor died on one record at
    a time, and the record that died CRASH_LIMIT times alone is dead-lettered as
    `unreadable` (value, key and headers); every other record is delivered once."""
    settings = Settings.from_env({**env, "BLACKBOX_INTAKE_BATCH": "50"})
    clients.ensure_topics(settings.kafka, settings.own_topics)
    bootstrap = settings.kafka["bootstrap.servers"]
    target = unique("poisoned")
    before = [envelope(target, {"n": n}, 0) for n in range(5)]
    after = [envelope(target, {"n": n}, 0) for n in range(5, 10)]
    for value in [*before, POISON, *after]:
        kcat_produce(bootstrap, settings.intake_topic, Hostile("", value, b"k", [CALLER], None))
    deaths = 0
    while True:
        service = Service(settings)
        service.start()
        try:
            wait_until(lambda s=service: s.failed or _committed(  # type: ignore[misc]
                bootstrap, settings.group_id, settings.intake_topic) == 11,
                timeout=60, what="a death or every offset committed")  # fmt: skip
        finally:
            service.stop()
        if not service.failed:
            break
        deaths += 1
        assert deaths <= CRASH_LIMIT + 1, "the guard never set the record aside"

    (letter,) = reader(settings.dlq_topic).wait_count(1)
    delivered = reader(target).wait_count(10)
    assert letter.header("blackbox-dlq-reason") == DeadLetterReason.UNREADABLE
    assert (letter.value, letter.key) == (POISON, b"k")
    assert letter.header(CALLER_HEADER) == "billing"
    assert "blackbox-dlq-headers-omitted" not in letter.headers
    assert int(letter.header("blackbox-dlq-offset")) == 5
    assert sorted(orjson.loads(r.value or b"")["n"] for r in delivered) == list(range(10))
    assert deaths >= CRASH_LIMIT
    assert set(crashing_on_poison) == {5}


def test_an_error_no_check_foresaw_dead_letters_that_record_only(
    start_service: ServiceFactory, reader: ReaderFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee 4: an exception raised while parsing one record (a bug) dead-letters that
    record as `unreadable` with the error as detail; the records around it are delivered and
    the intake never stops."""
    parse = envelope_module.parse

    def failing(value: bytes | None, *args: Any) -> object:
        if value == POISON:
            raise KeyError("unforeseen")
        return parse(value, *args)

    monkeypatch.setattr(envelope_module, "parse", failing)
    service = start_service()
    settings = service.settings
    bootstrap = settings.kafka["bootstrap.servers"]
    target = unique("unforeseen")
    values = [envelope(target, {"n": 0}, 0), POISON, envelope(target, {"n": 1}, 0)]
    for value in values:
        kcat_produce(bootstrap, settings.intake_topic, Hostile("", value, None, [CALLER], None))
    (letter,) = reader(settings.dlq_topic).wait_count(1)
    delivered = reader(target).wait_count(2)
    assert letter.header("blackbox-dlq-reason") == DeadLetterReason.UNREADABLE
    assert "unforeseen" in letter.header("blackbox-dlq-detail")
    assert letter.header(CALLER_HEADER) == "billing"
    assert sorted(orjson.loads(r.value or b"")["n"] for r in delivered) == [0, 1]
    assert not service.failed

"""client.envelope: what the Python client sends is what the intake parser reads back."""

from __future__ import annotations

import base64
import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, Message, Producer
from hypothesis import example, given, settings
from hypothesis import strategies as st

from blackbox import client, envelope
from blackbox.envelope import CALLER_HEADER, Envelope, Limits
from blackbox.kafka.clients import java_partition

LIMITS = Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset({"blackbox"}))
PROPERTY = settings(max_examples=200, deadline=None, database=None)
NEW_YEAR_2030 = datetime(2030, 1, 1, tzinfo=UTC)
NEW_YEAR_2030_MS = 1_893_456_000_000

json_values: st.SearchStrategy[object] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
moments = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(3900, 1, 1),
    timezones=st.integers(min_value=-1439, max_value=1439).map(
        lambda minutes: timezone(timedelta(minutes=minutes))
    ),
)
printable = st.text(
    alphabet=st.characters(exclude_categories=("C", "Z")) | st.just(" "), min_size=1, max_size=60
)
header_names = st.text(min_size=1, max_size=12).filter(
    lambda n: not n.lower().startswith("blackbox-") and n != CALLER_HEADER
)


def parsed(document: dict[str, object], caller: bytes | None = None) -> Envelope:
    """What blackbox's intake makes of a client envelope, sent as JSON."""
    headers = None if caller is None else [(CALLER_HEADER, caller)]
    request = envelope.parse(orjson.dumps(document), headers, LIMITS)
    assert isinstance(request, Envelope), request
    return request


def exact_ms(moment: datetime) -> int:
    """An aware datetime as epoch milliseconds, rounded up, in integer arithmetic."""
    micros = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return -(-micros // 1000)


def test_delay_becomes_a_countdown_in_seconds() -> None:
    """A delay in seconds, or as a timedelta, is sent as `countdown` seconds."""
    assert client.envelope("orders", {"a": 1}, delay=5) == {
        "topic": "orders",
        "message": {"a": 1},
        "countdown": 5.0,
    }
    sent = client.envelope("orders", 1, delay=timedelta(minutes=1, milliseconds=500))
    assert sent["countdown"] == 60.5
    assert client.envelope("orders", 1, delay=0)["countdown"] == 0.0


def test_aware_datetime_becomes_rfc3339_deliver_at() -> None:
    """An aware datetime is sent as its isoformat, offset included."""
    india = timezone(timedelta(hours=5, minutes=30))
    at = datetime(2030, 1, 1, 5, 30, tzinfo=india)
    sent = client.envelope("orders", 1, at=at)
    assert sent["deliver_at"] == "2030-01-01T05:30:00+05:30"
    assert "countdown" not in sent
    assert parsed(sent).at_ms == NEW_YEAR_2030_MS


def test_naive_datetime_is_refused() -> None:
    """A naive datetime names no instant: the client refuses it before sending."""
    with pytest.raises(ValueError, match="timezone-aware"):
        client.envelope("orders", 1, at=datetime(2030, 1, 1))


@pytest.mark.parametrize(("at", "expected"), [(1_893_456_000, 1_893_456_000.0), (1.5, 1.5)])
def test_epoch_seconds_become_a_numeric_deliver_at(at: float, expected: float) -> None:
    """A number for `at` is unix seconds, sent as a JSON number."""
    sent = client.envelope("orders", 1, at=at)
    assert sent["deliver_at"] == expected
    assert isinstance(sent["deliver_at"], float)


@pytest.mark.parametrize("payload", [b"\x00\xff raw", bytearray(b"\x01\x02"), memoryview(b"mv")])
def test_bytes_go_as_message_base64(payload: bytes | bytearray | memoryview) -> None:
    """Bytes, bytearray and memoryview are sent as base64 and decode to the same bytes."""
    sent = client.envelope("orders", payload, delay=1)
    assert "message" not in sent
    assert base64.b64decode(sent["message_base64"]) == bytes(payload)


def test_text_and_json_go_as_message() -> None:
    """A string or any other JSON value is sent as `message`, untouched."""
    assert client.envelope("orders", "héllo", delay=1)["message"] == "héllo"
    assert client.envelope("orders", [1, None], delay=1)["message"] == [1, None]


def test_optional_parts_are_sent_only_when_given() -> None:
    """key, headers and id appear when given; empty headers are left out."""
    bare = client.envelope("orders", 1, delay=1, headers={})
    assert set(bare) == {"topic", "message", "countdown"}
    full = client.envelope(
        "orders", 1, delay=1, key="k", headers={"trace": "1"}, schedule_id="order-42"
    )
    assert (full["key"], full["headers"], full["id"]) == ("k", {"trace": "1"}, "order-42")


def test_exactly_one_of_delay_and_at() -> None:
    """Giving neither or both of delay and at is a ValueError, not a guess."""
    with pytest.raises(ValueError, match="exactly one"):
        client.envelope("orders", 1)
    with pytest.raises(ValueError, match="exactly one"):
        client.envelope("orders", 1, delay=1, at=NEW_YEAR_2030)


@pytest.mark.parametrize("delay", [-1, -0.001, timedelta(seconds=-1), math.nan, math.inf], ids=repr)
def test_negative_or_non_finite_delay_is_refused(delay: float | timedelta) -> None:
    """A delay below zero (or NaN, infinite) is refused by the client, not dead-lettered later."""
    with pytest.raises(ValueError, match="delay"):
        client.envelope("orders", 1, delay=delay)


def test_a_full_envelope_means_the_same_to_the_parser() -> None:
    """Every part the client sets arrives in the Envelope the intake parses."""
    sent = client.envelope(
        "orders",
        b"\x00payload",
        at=NEW_YEAR_2030,
        key="customer-7",
        headers={"trace": "abc"},
        schedule_id="order-42",
    )
    assert parsed(sent, b"billing") == Envelope(
        topic="orders",
        value=b"\x00payload",
        caller=b"billing",
        at_ms=NEW_YEAR_2030_MS,
        key=b"customer-7",
        headers=(("trace", b"abc"),),
        schedule_id="order-42",
    )


@PROPERTY
@given(
    json_values | st.binary(max_size=100),
    st.floats(min_value=0, max_value=1e9)
    | st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=365_000))
    | moments,
    st.none() | st.text(max_size=20),
    st.dictionaries(header_names, st.text(max_size=20), max_size=3),
    st.none() | printable,
)
# A float whose binary product with 1000 rounds up past its decimal text's.
@example("", 16848000.1, None, {}, None)
def test_any_client_envelope_round_trips_through_the_parser(
    message: object,
    when: float | timedelta | datetime,
    key: str | None,
    headers: dict[str, str],
    schedule_id: str | None,
) -> None:
    """Whatever the client builds, the real parser accepts with the same meaning."""
    at, delay = (when, None) if isinstance(when, datetime) else (None, when)
    sent = client.envelope(
        "orders", message, delay=delay, at=at, key=key, headers=headers, schedule_id=schedule_id
    )
    request = parsed(sent)
    if isinstance(message, bytes):
        assert request.value == message
    elif isinstance(message, str):
        assert request.value == message.encode()
    else:
        assert orjson.loads(request.value) == message
    if isinstance(when, datetime):
        assert (request.at_ms, request.countdown_ms) == (exact_ms(when), None)
    else:
        seconds = when.total_seconds() if isinstance(when, timedelta) else when
        # As JSON carries it: the float's shortest decimal text, in ms rounded up (in binary,
        # 16848000.1 * 1000 is 16848000100.000002).
        expected_ms = math.ceil(Decimal(repr(float(seconds))).scaleb(3))
        assert (request.at_ms, request.countdown_ms) == (None, expected_ms)
    assert request.key == (None if key is None else key.encode())
    assert request.headers == tuple((n, v.encode()) for n, v in headers.items())
    assert request.schedule_id == schedule_id


def test_the_clients_producer_is_idempotent_unless_told_otherwise() -> None:
    """Guarantee 2: a producer retry after a broker failure must not write a request twice
    (two intake records would be two schedules under two ids)."""
    config = client.producer_config({"bootstrap.servers": "k:9092"})

    assert config == {
        "bootstrap.servers": "k:9092",
        "enable.idempotence": "true",
        "acks": "all",
        "partitioner": "murmur2_random",
    }
    assert client.producer_config({"acks": "1"})["acks"] == "1"


def test_java_partition_is_kafkas_murmur2() -> None:
    """Java's partitioner as blackbox computes it (the intake checks a signed record's
    partition with it; the tests use it as their oracle) gives Kafka's own murmur2 test
    vectors."""
    vectors = {b"21": -973932308, b"foobar": -790332482, b"abc": 479470107,
               b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829}  # fmt: skip
    big = 2**31 - 1
    for key, java_int in vectors.items():
        assert java_partition(key, big) == (java_int & 0x7FFFFFFF) % big


class _Recording(Producer):
    """A producer that keeps what it is asked to produce (no broker: pure client logic)."""

    def __init__(self) -> None:
        super().__init__({"bootstrap.servers": "127.0.0.1:1"})
        self.sent: list[tuple[Any, ...]] = []

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.sent.append((*args, kwargs.get("headers")))


def _consumed(**fields: Any) -> Message:
    headers = [("CALLER_SERVICE", b"upstream"), ("trace", b"\xfe"), ("n", None)]
    record = {"topic": "orders", "partition": 2, "offset": 7, "value": b"\x00v", "key": b"k\xff",
              "headers": headers}  # fmt: skip
    return Message(**{**record, **fields})


def test_retry_copies_the_record_and_names_where_it_was_read() -> None:
    producer = _Recording()
    retrying = client.Client(producer, caller="worker", intake_topic="intake")
    retrying.retry(_consumed(), ValueError("no stock"), policy={"delays": [5]})
    [(topic, value, key, headers)] = producer.sent
    assert (topic, value, key) == ("intake", b"\x00v", b"k\xff")
    assert headers[:3] == [("CALLER_SERVICE", b"worker"), ("trace", b"\xfe"), ("n", None)]
    assert dict(headers[3:]) == {
        "blackbox-retry-error": b"ValueError: no stock",
        "blackbox-retry-source": b"orders/2/7",
        "blackbox-retry-policy": b'{"delays":[5]}',
    }


def test_retry_refuses_a_consumer_event_and_survives_any_error_text() -> None:
    producer = _Recording()
    retrying = client.Client(producer, caller="worker", intake_topic="intake")
    with pytest.raises(ValueError, match="not a consumer event"):
        retrying.retry(_consumed(error=KafkaError(KafkaError._PARTITION_EOF)), "eof")
    assert producer.sent == []
    retrying.retry(_consumed(), "file \udcff unreadable")  # a lone surrogate
    [(*_, headers)] = producer.sent
    assert dict(headers)["blackbox-retry-error"] == b"file ? unreadable"

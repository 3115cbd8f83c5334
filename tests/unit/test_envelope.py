"""envelope.parse: a bad record yields an exact DeadLetterReason, never a crash (Guarantee 4)."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blackbox import envelope
from blackbox.envelope import CALLER_HEADER, MAX_CALLER_CHARS, Envelope, Headers, Limits
from blackbox.errors import DeadLetterReason, InvalidEnvelope

LIMITS = Limits(
    max_value_bytes=1_048_576,
    max_countdown_seconds=315_576_000.0,
    forbidden_topics=frozenset({"blackbox", "blackbox.dlq"}),
)
PROPERTY = settings(max_examples=300, deadline=None, database=None)

json_scalars: st.SearchStrategy[object] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_values: st.SearchStrategy[object] = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
valid_topics = st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True).filter(
    lambda t: t not in {".", ".."} and not t.startswith("__") and t not in LIMITS.forbidden_topics
)
callers = st.text(
    alphabet=st.characters(exclude_categories=("C", "Z")) | st.just(" "),
    min_size=1,
    max_size=MAX_CALLER_CHARS,
).filter(str.isprintable)
countdowns: st.SearchStrategy[float] = st.one_of(
    st.integers(min_value=0, max_value=int(LIMITS.max_countdown_seconds)),
    st.floats(min_value=0, max_value=LIMITS.max_countdown_seconds),
)
header_names = st.sampled_from([CALLER_HEADER, "trace-id", ""]) | st.text(max_size=16)
header_lists: st.SearchStrategy[list[tuple[str, bytes | None]]] = st.lists(
    st.tuples(header_names, st.none() | st.binary(max_size=300) | st.sampled_from([b"\xff", b""])),
    max_size=4,
)
envelope_like: st.SearchStrategy[dict[str, object]] = st.fixed_dictionaries(
    {},
    optional={
        "topic": valid_topics | st.sampled_from(["__x", ".", "", "blackbox", "a b"]) | json_values,
        "message": json_values,
        "countdown": countdowns | st.sampled_from([-1, -0.5, 1e300, True]) | json_values,
        "extra": json_values,
    },
)


def record(**fields: object) -> bytes:
    """A JSON intake value: a valid request with `fields` replaced (None drops the field)."""
    document: dict[str, object] = {"topic": "orders", "message": {"id": 1}, "countdown": 5}
    document.update(fields)
    return orjson.dumps({k: v for k, v in document.items() if v is not None})


def reason_of(value: bytes | None, headers: Headers | None = None, limits: Limits = LIMITS) -> str:
    """The reason parse gives for refusing a record (fails the test if it accepts it)."""
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(value, headers, limits)
    return caught.value.reason


def test_valid_record_parses() -> None:
    """A well-formed record yields its topic, message bytes, countdown in ms and caller."""
    parsed = envelope.parse(record(), [(CALLER_HEADER, b"billing")], LIMITS)
    assert parsed == Envelope(
        topic="orders", value=b'{"id":1}', countdown_ms=5000, caller=b"billing"
    )


def test_string_message_is_delivered_as_its_text() -> None:
    """A JSON string message is delivered as its UTF-8 text, not as a quoted JSON string."""
    parsed = envelope.parse(record(message="héllo"), None, LIMITS)
    assert parsed.value == "héllo".encode()


def test_countdown_rounds_up_to_whole_milliseconds() -> None:
    """A fractional countdown is rounded up, so a message never fires before it is due."""
    assert envelope.parse(record(countdown=0.0001), None, LIMITS).countdown_ms == 1
    assert envelope.parse(record(countdown=1.5), None, LIMITS).countdown_ms == 1500
    assert envelope.parse(record(countdown=0), None, LIMITS).countdown_ms == 0
    assert envelope.parse(record(countdown=-0.0), None, LIMITS).countdown_ms == 0


def test_countdown_at_the_limit_is_accepted() -> None:
    """A countdown equal to Limits.max_countdown_seconds is accepted (the limit is inclusive)."""
    parsed = envelope.parse(record(countdown=315_576_000), None, LIMITS)
    assert parsed.countdown_ms == 315_576_000_000


def test_value_at_the_size_limit_is_accepted() -> None:
    """A value of exactly max_value_bytes is accepted; one byte more is oversized."""
    value = record()
    exact = Limits(len(value), LIMITS.max_countdown_seconds, LIMITS.forbidden_topics)
    assert envelope.parse(value, None, exact).topic == "orders"
    smaller = Limits(len(value) - 1, LIMITS.max_countdown_seconds, LIMITS.forbidden_topics)
    assert reason_of(value, None, smaller) == DeadLetterReason.OVERSIZED


def test_missing_caller_header_is_none() -> None:
    """Without a CALLER_SERVICE header the caller is None; other headers are ignored."""
    assert envelope.parse(record(), [("trace-id", b"\xff")], LIMITS).caller is None
    assert envelope.parse(record(), None, LIMITS).caller is None


def test_repeated_caller_header_is_invalid_header() -> None:
    """Guarantee 4: two CALLER_SERVICE headers make the sender ambiguous: refused."""
    headers = [(CALLER_HEADER, b"first"), (CALLER_HEADER, b"second")]
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(record(), headers, LIMITS)
    assert caught.value.reason is DeadLetterReason.INVALID_HEADER


def test_caller_of_the_maximum_length_is_accepted() -> None:
    """A CALLER_SERVICE of exactly 255 characters (multi-byte ones count once) is accepted."""
    caller = ("é" * MAX_CALLER_CHARS).encode()
    assert envelope.parse(record(), [(CALLER_HEADER, caller)], LIMITS).caller == caller


def test_empty_value_is_a_tombstone() -> None:
    """Guarantee 4: a record with no value (tombstone) is refused as empty_value."""
    assert reason_of(None) == DeadLetterReason.EMPTY_VALUE


def test_oversized_value() -> None:
    """Guarantee 4: a value above max_value_bytes is refused as oversized before it is decoded."""
    limits = Limits(100, LIMITS.max_countdown_seconds, LIMITS.forbidden_topics)
    assert reason_of(b"x" * 101, None, limits) == DeadLetterReason.OVERSIZED


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"", id="empty-bytes"),
        pytest.param(b"not json", id="text"),
        pytest.param(b'{"topic": "orders", "countdown": NaN, "message": 1}', id="nan-literal"),
        pytest.param(b'{"topic": "orders", "countdown": 1e400, "message": 1}', id="infinity"),
        pytest.param(b'{"topic": "orders", "message": ', id="truncated"),
        pytest.param(b'{"topic": "ord\xffers", "message": 1, "countdown": 1}', id="invalid-utf8"),
        pytest.param(b'{"topic": "orders", "message": "\\ud800"}', id="lone-surrogate"),
        pytest.param(b"[" * 2000 + b"]" * 2000, id="2000-deep-array"),
        pytest.param(b'{"a":' * 2000 + b"1" + b"}" * 2000, id="2000-deep-object"),
        pytest.param(b"{'topic': 'orders'}", id="single-quotes"),
    ],
)
def test_invalid_json(value: bytes) -> None:
    """Guarantee 4: a value that is not strict JSON is refused as invalid_json."""
    assert reason_of(value) == DeadLetterReason.INVALID_JSON


def test_invalid_json_chains_the_decoder_error() -> None:
    """Parse failures keep the decoder's error as the cause (STYLE: cause chained with `from e`)."""
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(b"{", None, LIMITS)
    assert isinstance(caught.value.__cause__, orjson.JSONDecodeError)
    assert str(caught.value).startswith("invalid_json: ")


@pytest.mark.parametrize(
    "value", [b"[]", b"[1, 2]", b'"text"', b"42", b"1.5", b"true", b"null"], ids=bytes.decode
)
def test_not_an_object(value: bytes) -> None:
    """Guarantee 4: valid JSON that is not an object is refused as not_an_object."""
    assert reason_of(value) == DeadLetterReason.NOT_AN_OBJECT


@pytest.mark.parametrize("field", ["topic", "message", "countdown"])
def test_missing_field(field: str) -> None:
    """Guarantee 4: a record without topic, message or countdown is refused as missing_field."""
    document = {"topic": "orders", "message": 1, "countdown": 5}
    del document[field]
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(orjson.dumps(document), None, LIMITS)
    assert caught.value.reason == DeadLetterReason.MISSING_FIELD
    assert repr(field) in caught.value.detail


def test_null_message_is_delivered_as_json_null() -> None:
    """An explicit `"message": null` is a present field, delivered as the JSON text null."""
    value = b'{"topic": "orders", "message": null, "countdown": 1}'
    assert envelope.parse(value, None, LIMITS).value == b"null"


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"countdown": True}, id="countdown-bool-true"),
        pytest.param({"countdown": False}, id="countdown-bool-false"),
        pytest.param({"countdown": "5"}, id="countdown-string"),
        pytest.param({"countdown": [5]}, id="countdown-array"),
        pytest.param({"countdown": {"s": 5}}, id="countdown-object"),
        pytest.param({"topic": 42}, id="topic-number"),
        pytest.param({"topic": ["orders"]}, id="topic-array"),
        pytest.param({"topic": True}, id="topic-bool"),
    ],
)
def test_wrong_type(fields: dict[str, object]) -> None:
    """Guarantee 4: a non-string topic or a non-number countdown is wrong_type."""
    assert reason_of(record(**fields)) == DeadLetterReason.WRONG_TYPE


def test_null_countdown_is_wrong_type() -> None:
    """An explicit `"countdown": null` is present but not a number: wrong_type."""
    value = b'{"topic": "orders", "message": 1, "countdown": null}'
    assert reason_of(value) == DeadLetterReason.WRONG_TYPE


@pytest.mark.parametrize(
    "countdown",
    [
        pytest.param(b"-1", id="negative-int"),
        pytest.param(b"-0.001", id="negative-float"),
        pytest.param(b"315576000.5", id="just-beyond-limit"),
        pytest.param(b"1000000000000", id="absurd"),
        pytest.param(b"1e300", id="huge-float"),
        pytest.param(b"18446744073709551616", id="beyond-64-bit"),
    ],
)
def test_invalid_countdown(countdown: bytes) -> None:
    """Guarantee 4: a negative countdown or one beyond the horizon is invalid_countdown."""
    value = b'{"topic": "orders", "message": 1, "countdown": %s}' % countdown
    assert reason_of(value) == DeadLetterReason.INVALID_COUNTDOWN


def test_countdown_near_float_max_under_a_permissive_limit_is_refused_cleanly() -> None:
    """Guarantee 4: under any positive finite limit a huge countdown is invalid_countdown."""
    permissive = Limits(LIMITS.max_value_bytes, 1e308, LIMITS.forbidden_topics)
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(record(countdown=1e306), None, permissive)
    assert caught.value.reason == DeadLetterReason.INVALID_COUNTDOWN


@pytest.mark.parametrize(
    "topic",
    [
        pytest.param("", id="empty"),
        pytest.param("a" * 250, id="250-chars"),
        pytest.param(".", id="dot"),
        pytest.param("..", id="dot-dot"),
        pytest.param("orders events", id="space"),
        pytest.param("orders/events", id="slash"),
        pytest.param("orders:events", id="colon"),
        pytest.param("orders\n", id="trailing-newline"),
        pytest.param("ordérs", id="non-ascii"),
        pytest.param("orders\x00", id="nul"),
    ],
)
def test_invalid_topic(topic: str) -> None:
    """Guarantee 4: a topic Kafka would refuse as a name is invalid_topic."""
    assert reason_of(record(topic=topic)) == DeadLetterReason.INVALID_TOPIC


def test_topic_of_249_chars_is_accepted() -> None:
    """A topic of 249 characters, Kafka's maximum, is a valid target."""
    assert envelope.parse(record(topic="a" * 249), None, LIMITS).topic == "a" * 249


@pytest.mark.parametrize(
    "topic", ["__consumer_offsets", "__transaction_state", "__anything", "blackbox", "blackbox.dlq"]
)
def test_forbidden_topic(topic: str) -> None:
    """Guarantee 1: internal `__` topics and Limits.forbidden_topics are forbidden_topic."""
    assert reason_of(record(topic=topic)) == DeadLetterReason.FORBIDDEN_TOPIC


@pytest.mark.parametrize(
    "caller",
    [
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param(b"\xed\xa0\x80", id="encoded-surrogate"),
        pytest.param(b"", id="empty"),
        pytest.param(b"a" * (MAX_CALLER_CHARS + 1), id="too-long"),
        pytest.param(b"billing\n", id="control-char"),
        pytest.param(b"billing\x00", id="nul"),
    ],
)
def test_invalid_header(caller: bytes) -> None:
    """Guarantee 4: a CALLER_SERVICE header that is not short printable UTF-8 is invalid_header."""
    assert reason_of(record(), [(CALLER_HEADER, caller)]) == DeadLetterReason.INVALID_HEADER


def test_caller_header_without_a_value_is_invalid_header() -> None:
    """Guarantee 4: a CALLER_SERVICE header present with a None value is invalid_header."""
    assert reason_of(record(), [(CALLER_HEADER, None)]) == DeadLetterReason.INVALID_HEADER


def test_invalid_header_wins_over_a_bad_value() -> None:
    """The caller header is checked first: a bad header with a tombstone is invalid_header."""
    assert reason_of(None, [(CALLER_HEADER, b"\xff")]) == DeadLetterReason.INVALID_HEADER


def test_invalid_envelope_message_names_reason_and_detail() -> None:
    """InvalidEnvelope carries its reason, a detail, and reads as 'reason: detail'."""
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(record(countdown=-5), None, LIMITS)
    error = caught.value
    assert error.reason is DeadLetterReason.INVALID_COUNTDOWN
    assert "-5" in error.detail
    assert str(error) == f"invalid_countdown: {error.detail}"


def test_normalize_headers_encodes_text_and_keeps_order_and_repeats() -> None:
    """Kafka client headers (list or dict, str or bytes or None) become ordered (name, bytes)."""
    raw: list[tuple[str, str | bytes | None]] = [
        ("a", "x"),
        ("b", b"\xff"),
        ("a", None),
        ("c", "é"),
    ]
    assert envelope.normalize_headers(raw) == [
        ("a", b"x"),
        ("b", b"\xff"),
        ("a", None),
        ("c", "é".encode()),
    ]
    assert envelope.normalize_headers({"k": "v", "n": None}) == [("k", b"v"), ("n", None)]
    assert envelope.normalize_headers(None) == []


def assert_parse_is_total(value: bytes | None, headers: Headers | None) -> None:
    """parse returns an Envelope or raises InvalidEnvelope with a known reason; nothing else."""
    try:
        parsed = envelope.parse(value, headers, LIMITS)
    except InvalidEnvelope as e:
        assert e.reason in DeadLetterReason
        return
    assert isinstance(parsed, Envelope)


@PROPERTY
@given(st.none() | st.binary(max_size=2048), st.none() | header_lists)
def test_any_bytes_parse_or_refuse(value: bytes | None, headers: Headers | None) -> None:
    """Guarantee 4: for any bytes and headers, parse returns an Envelope or InvalidEnvelope."""
    assert_parse_is_total(value, headers)


@PROPERTY
@given(json_values, st.none() | header_lists)
def test_any_json_parse_or_refuse(document: object, headers: Headers | None) -> None:
    """Guarantee 4: for any JSON value, parse returns an Envelope or raises InvalidEnvelope."""
    assert_parse_is_total(orjson.dumps(document), headers)


@PROPERTY
@given(envelope_like, st.none() | header_lists)
def test_any_envelope_like_object_parse_or_refuse(
    document: dict[str, object], headers: Headers | None
) -> None:
    """Guarantee 4: objects with any mix of fields and types parse or raise InvalidEnvelope."""
    assert_parse_is_total(orjson.dumps(document), headers)


@PROPERTY
@given(valid_topics, json_values, countdowns, st.none() | callers)
def test_valid_envelope_round_trips(
    topic: str, message: object, countdown: float, caller: str | None
) -> None:
    """A valid request keeps its topic, message bytes, ceil(countdown*1000) ms and caller."""
    value = orjson.dumps({"topic": topic, "message": message, "countdown": countdown})
    headers = None if caller is None else [(CALLER_HEADER, caller.encode())]
    parsed = envelope.parse(value, headers, LIMITS)
    expected = message.encode() if isinstance(message, str) else orjson.dumps(message)
    assert parsed.topic == topic
    assert parsed.value == expected
    assert parsed.countdown_ms == math.ceil(countdown * 1000)
    assert parsed.caller == (None if caller is None else caller.encode())

"""envelope.parse: a bad record yields an exact DeadLetterReason, never a crash (Guarantee 4)."""

from __future__ import annotations

import base64
import calendar
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blackbox import envelope
from blackbox.envelope import (
    CALLER_HEADER,
    EPOCH_HEADER,
    TARGET_KEY_HEADER,
    TARGET_TOPIC_HEADER,
    Cancel,
    Envelope,
    Header,
    Headers,
    Limits,
)
from blackbox.errors import DeadLetterReason, InvalidEnvelope

LIMITS = Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset({"blackbox", "blackbox.dlq"}))
PROPERTY = settings(max_examples=300, deadline=None, database=None)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NEW_YEAR_2030_MS = 1_893_456_000_000
# The README's limits, stated here rather than imported, so a wrong constant fails a test.
THOUSAND_YEARS_S = 31_557_600_000  # 1,000 x 365.25 days
MAX_CALLER_CHARS = 255
MAX_ID_CHARS = 255

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
printable = st.text(
    alphabet=st.characters(exclude_categories=("C", "Z")) | st.just(" "),
    min_size=1,
    max_size=MAX_CALLER_CHARS,
).filter(str.isprintable)
callers = printable
ids = printable
countdowns: st.SearchStrategy[float] = st.one_of(
    st.integers(min_value=0, max_value=THOUSAND_YEARS_S),
    st.floats(min_value=0, max_value=THOUSAND_YEARS_S),
)
# A countdown in whole milliseconds, sent as the decimal seconds a sender would write.
countdown_ms_values = st.integers(min_value=0, max_value=THOUSAND_YEARS_S * 1000)
offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
moments = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(3900, 1, 1), timezones=offsets
)
rfc3339_times = moments.map(datetime.isoformat) | moments.map(
    lambda m: m.astimezone(UTC).isoformat().replace("+00:00", "Z")
)
allowed_header_names = st.text(min_size=1, max_size=16).filter(
    lambda n: not n.lower().startswith("blackbox-") and n != CALLER_HEADER
)
header_names = (
    st.sampled_from([CALLER_HEADER, EPOCH_HEADER, TARGET_TOPIC_HEADER, TARGET_KEY_HEADER])
    | st.sampled_from(["trace-id", "", "blackbox-id", "scheduler-key"])
    | st.text(max_size=16)
)
header_values = (
    st.none()
    | st.binary(max_size=300)
    | st.sampled_from([b"\xff", b"", b"1893456000", b"-1", b"nan", b"1e400", b"orders", b"1.5"])
)
header_lists: st.SearchStrategy[list[Header]] = st.lists(
    st.tuples(header_names, header_values), max_size=6
)
record_keys = st.none() | st.binary(max_size=300) | st.sampled_from([b"", b"id-1", b"\xff"])
envelope_like: st.SearchStrategy[dict[str, object]] = st.fixed_dictionaries(
    {},
    optional={
        "topic": valid_topics | st.sampled_from(["__x", ".", "", "blackbox", "a b"]) | json_values,
        "message": json_values,
        "message_base64": st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode())
        | st.sampled_from(["abc", "!!", "é", ""])
        | json_values,
        "countdown": countdowns | st.sampled_from([-1, -0.5, 1e300, True]) | json_values,
        "deliver_at": rfc3339_times
        | st.sampled_from(["2030-01-01T00:00:00", "2030-01-01", "soon", "", "9999-12-31T00:00Z"])
        | st.floats()
        | json_values,
        "key": st.text(max_size=8) | json_values,
        "headers": st.dictionaries(header_names, st.text(max_size=8) | json_values, max_size=3)
        | json_values,
        "id": ids | st.sampled_from(["", "a\nb", "x" * 256]) | json_values,
        "cancel": st.booleans() | json_values,
        "extra": json_values,
    },
)


def record(**fields: object) -> bytes:
    """A JSON intake value: a valid request with `fields` replaced (None drops the field)."""
    document: dict[str, object] = {"topic": "orders", "message": {"id": 1}, "countdown": 5}
    document.update(fields)
    return orjson.dumps({k: v for k, v in document.items() if v is not None})


def timed(deliver_at: object, **fields: object) -> bytes:
    """A JSON intake value due at `deliver_at` rather than after a countdown."""
    return record(countdown=None, deliver_at=deliver_at, **fields)


def accepted(
    value: bytes | None, headers: Headers | None = None, key: bytes | None = None
) -> Envelope:
    """The schedule parse makes of a record (fails the test on a refusal or a cancel)."""
    parsed = envelope.parse(value, headers, LIMITS, key)
    assert isinstance(parsed, Envelope), parsed
    return parsed


def cancelled(
    value: bytes | None, headers: Headers | None = None, key: bytes | None = None
) -> Cancel:
    """The cancel parse makes of a record (fails the test on a refusal or a schedule)."""
    parsed = envelope.parse(value, headers, LIMITS, key)
    assert isinstance(parsed, Cancel), parsed
    return parsed


def reason_of(
    value: bytes | None,
    headers: Headers | None = None,
    limits: Limits = LIMITS,
    key: bytes | None = None,
) -> str:
    """The reason parse gives for refusing a record (fails the test if it accepts it)."""
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(value, headers, limits, key)
    return caught.value.reason


def etf1(
    epoch: bytes | None = b"1893456000", topic: bytes | None = b"orders", *extra: Header
) -> list[Header]:
    """Header-mode headers: epoch and target topic (None leaves one out), then `extra`."""
    named = [(EPOCH_HEADER, epoch), (TARGET_TOPIC_HEADER, topic)]
    return [(name, v) for name, v in named if v is not None] + list(extra)


def payload_of(message: object) -> bytes:
    """What a JSON-mode message is delivered as: bytes as they are, text as UTF-8, else JSON."""
    if isinstance(message, bytes):
        return message
    if isinstance(message, str):
        return message.encode()
    return orjson.dumps(message)


def exact_ms(moment: datetime) -> int:
    """An aware datetime as epoch milliseconds, rounded up: calendar seconds plus the ms part.

    Computed another way than the parser does (calendar.timegm on the UTC fields, not
    datetime subtraction), so a mistake the two share cannot pass.
    """
    seconds = calendar.timegm(moment.utctimetuple())
    return seconds * 1000 + (moment.microsecond + 999) // 1000


# JSON mode: topic, message, countdown, caller


def test_valid_record_parses() -> None:
    """A well-formed record yields its topic, message bytes, countdown in ms and caller."""
    parsed = envelope.parse(record(), [(CALLER_HEADER, b"billing")], LIMITS)
    assert parsed == Envelope(
        topic="orders", value=b'{"id":1}', countdown_ms=5000, caller=b"billing"
    )


def test_string_message_is_delivered_as_its_text() -> None:
    """A JSON string message is delivered as its UTF-8 text, not as a quoted JSON string."""
    assert accepted(record(message="héllo")).value == "héllo".encode()


def test_countdown_rounds_up_to_whole_milliseconds() -> None:
    """A fractional countdown is rounded up, so a message never fires before it is due."""
    assert accepted(record(countdown=0.0001)).countdown_ms == 1
    assert accepted(record(countdown=1.5)).countdown_ms == 1500
    assert accepted(record(countdown=0)).countdown_ms == 0
    assert accepted(record(countdown=-0.0)).countdown_ms == 0


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        (b"2.007", 2007),
        (b"0.001", 1),
        (b"1.1", 1100),
        (b"0.0010001", 2),
        (b"2.5e-3", 3),
        (b"1e3", 1_000_000),
    ],
)
def test_countdown_is_the_milliseconds_the_sender_wrote(text: bytes, expected_ms: int) -> None:
    """A countdown of 2.007 s is 2007 ms, not 2008: binary floating point moves no ms."""
    value = b'{"topic":"orders","message":1,"countdown":' + text + b"}"
    assert accepted(value).countdown_ms == expected_ms


@PROPERTY
@given(st.integers(min_value=0, max_value=THOUSAND_YEARS_S * 1000))
def test_any_countdown_in_milliseconds_is_kept_exactly(ms: int) -> None:
    """A countdown written as seconds with up to 3 decimals up to 1,000 years is that many ms."""
    text = f"{ms // 1000}.{ms % 1000:03d}".encode()
    value = b'{"topic":"orders","message":1,"countdown":' + text + b"}"
    assert accepted(value).countdown_ms == ms


@PROPERTY
@given(
    st.floats(min_value=THOUSAND_YEARS_S, max_value=1e300, exclude_min=True)
    | st.integers(min_value=THOUSAND_YEARS_S + 1, max_value=2**63)
)
def test_any_countdown_beyond_1000_years_is_refused(countdown: float) -> None:
    """Guarantee 4: one step past 1,000 years is invalid_countdown, however far."""
    assert reason_of(record(countdown=countdown)) == DeadLetterReason.INVALID_COUNTDOWN


def test_countdown_far_beyond_any_configured_horizon_is_left_to_the_policy() -> None:
    """The parser accepts 20 years: how far ahead a caller may schedule is the policy's call."""
    assert accepted(record(countdown=631_152_000)).countdown_ms == 631_152_000_000


def test_countdown_at_the_absolute_limit_is_accepted() -> None:
    """A countdown of exactly 1,000 years is accepted (the absolute limit is inclusive)."""
    parsed = accepted(record(countdown=THOUSAND_YEARS_S))
    assert parsed.countdown_ms == 31_557_600_000_000


def test_value_at_the_size_limit_is_accepted() -> None:
    """A value of exactly max_value_bytes is accepted; one byte more is oversized."""
    value = record()
    exact = Limits(len(value), LIMITS.forbidden_topics)
    assert envelope.parse(value, None, exact) == Envelope("orders", b'{"id":1}', None, 5000)
    smaller = Limits(len(value) - 1, LIMITS.forbidden_topics)
    assert reason_of(value, None, smaller) == DeadLetterReason.OVERSIZED


def test_missing_caller_header_is_none() -> None:
    """Without a CALLER_SERVICE header the caller is None; other headers are ignored."""
    assert accepted(record(), [("trace-id", b"\xff")]).caller is None
    assert accepted(record()).caller is None


def test_repeated_caller_header_is_invalid_header() -> None:
    """Guarantee 4: two CALLER_SERVICE headers make the sender ambiguous: refused."""
    headers = [(CALLER_HEADER, b"first"), (CALLER_HEADER, b"second")]
    assert reason_of(record(), headers) == DeadLetterReason.INVALID_HEADER


def test_caller_of_the_maximum_length_is_accepted() -> None:
    """A CALLER_SERVICE of exactly 255 characters (multi-byte ones count once) is accepted."""
    caller = ("é" * MAX_CALLER_CHARS).encode()
    assert accepted(record(), [(CALLER_HEADER, caller)]).caller == caller


def test_oversized_value() -> None:
    """Guarantee 4: a value above max_value_bytes is refused as oversized before it is decoded."""
    limits = Limits(100, LIMITS.forbidden_topics)
    assert reason_of(b"x" * 101, None, limits) == DeadLetterReason.OVERSIZED


def test_oversized_header_mode_value() -> None:
    """The size limit holds in header mode too, where the value is the payload itself."""
    limits = Limits(100, LIMITS.forbidden_topics)
    assert reason_of(b"x" * 101, etf1(), limits, b"id") == DeadLetterReason.OVERSIZED


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
    assert accepted(b'{"topic": "orders", "message": null, "countdown": 1}').value == b"null"


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


@pytest.mark.parametrize(
    ("countdown", "kind"),
    [("5", "string"), (True, "boolean"), ([5], "array"), ({"s": 5}, "object")],
)
def test_wrong_type_detail_names_the_json_kind(countdown: object, kind: str) -> None:
    """Guarantee 4: the dead letter says what was sent instead: a string, boolean, array..."""
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(record(countdown=countdown), None, LIMITS)
    assert caught.value.detail == f"countdown must be a number, not {kind}"
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(record(topic=5), None, LIMITS)
    assert caught.value.detail == "topic must be a string, not number"
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(orjson.dumps({"topic": "t", "message": 1, "countdown": None}), None, LIMITS)
    assert caught.value.detail == "countdown must be a number, not null"


def test_null_countdown_is_wrong_type() -> None:
    """An explicit `"countdown": null` is present but not a number: wrong_type."""
    value = b'{"topic": "orders", "message": 1, "countdown": null}'
    assert reason_of(value) == DeadLetterReason.WRONG_TYPE


@pytest.mark.parametrize(
    "countdown",
    [
        pytest.param(b"-1", id="negative-int"),
        pytest.param(b"-0.001", id="negative-float"),
        pytest.param(b"31557600000.5", id="just-beyond-1000-years"),
        pytest.param(b"1000000000000", id="absurd"),
        pytest.param(b"1e300", id="huge-float"),
        pytest.param(b"1e306", id="near-float-max"),
        pytest.param(b"18446744073709551616", id="beyond-64-bit"),
    ],
)
def test_invalid_countdown(countdown: bytes) -> None:
    """Guarantee 4: a negative countdown or one beyond 1,000 years is invalid_countdown."""
    value = b'{"topic": "orders", "message": 1, "countdown": %s}' % countdown
    assert reason_of(value) == DeadLetterReason.INVALID_COUNTDOWN


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
    assert accepted(record(topic="a" * 249)).topic == "a" * 249


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
def test_invalid_caller_header(caller: bytes) -> None:
    """Guarantee 4: a CALLER_SERVICE header that is not short printable UTF-8 is invalid_header."""
    assert reason_of(record(), [(CALLER_HEADER, caller)]) == DeadLetterReason.INVALID_HEADER


def test_caller_header_without_a_value_is_invalid_header() -> None:
    """Guarantee 4: a CALLER_SERVICE header present with a None value is invalid_header."""
    assert reason_of(record(), [(CALLER_HEADER, None)]) == DeadLetterReason.INVALID_HEADER


def test_invalid_header_wins_over_a_bad_value() -> None:
    """The caller header is checked first: a bad header with a tombstone is invalid_header."""
    assert reason_of(None, [(CALLER_HEADER, b"\xff")], key=b"id") == DeadLetterReason.INVALID_HEADER


def test_invalid_envelope_message_names_reason_and_detail() -> None:
    """InvalidEnvelope carries its reason, a detail, and reads as 'reason: detail'."""
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(record(countdown=-5), None, LIMITS)
    error = caught.value
    assert error.reason is DeadLetterReason.INVALID_COUNTDOWN
    assert "-5" in error.detail
    assert str(error) == f"invalid_countdown: {error.detail}"


# JSON mode: deliver_at


@pytest.mark.parametrize(
    "text",
    [
        "2030-01-01T00:00:00Z",
        "2030-01-01T00:00:00+00:00",
        "2030-01-01T01:30:00+01:30",
        "2029-12-31T19:00:00-05:00",
        "2030-01-01T00:00:00.000Z",
    ],
)
def test_deliver_at_as_rfc3339_with_an_offset(text: str) -> None:
    """deliver_at as RFC 3339 text with Z or ±hh:mm names one instant, kept as at_ms."""
    parsed = accepted(timed(text))
    assert (parsed.at_ms, parsed.countdown_ms) == (NEW_YEAR_2030_MS, None)


def test_deliver_at_with_milliseconds_is_exact() -> None:
    """A millisecond in the text is that millisecond: no float rounding moves it by one."""
    assert accepted(timed("2039-07-18T23:58:33.135Z")).at_ms == 2_194_646_313_135


def test_deliver_at_rounds_microseconds_up() -> None:
    """A time between two milliseconds is due at the later one, never before it."""
    assert accepted(timed("2030-01-01T00:00:00.000001Z")).at_ms == NEW_YEAR_2030_MS + 1


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (1_893_456_000, NEW_YEAR_2030_MS),
        (1_893_456_000.5, NEW_YEAR_2030_MS + 500),
        (0, 0),
    ],
)
def test_deliver_at_as_epoch_seconds(seconds: float, expected: int) -> None:
    """deliver_at as a JSON number is unix seconds."""
    assert accepted(timed(seconds)).at_ms == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2030-01-01T00:00:00", id="no-offset"),
        pytest.param("2030-01-01T00:00:00.5", id="no-offset-fraction"),
        pytest.param("2030-01-01", id="date-only"),
        pytest.param("tomorrow", id="words"),
        pytest.param("", id="empty"),
        pytest.param("2030-13-01T00:00:00Z", id="month-13"),
        pytest.param("1969-12-31T23:59:59Z", id="before-1970"),
        pytest.param("9999-12-31T23:59:59Z", id="beyond-2000-years"),
    ],
)
def test_invalid_deliver_at_text(text: str) -> None:
    """Guarantee 4: deliver_at text without an offset, or not a usable time, is refused."""
    assert reason_of(timed(text)) == DeadLetterReason.INVALID_DELIVER_AT


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("20300101T000000Z", id="iso-basic-format"),
        pytest.param("2030-W01-2T00:00Z", id="iso-week-date"),
        pytest.param("2030-001T00:00:00Z", id="iso-ordinal-date"),
        pytest.param("2030-01-01 00:00:00Z", id="space-separator"),
        pytest.param("2030-01-01T00:00Z", id="no-seconds"),
        pytest.param("2030-01-01T00Z", id="hour-only"),
        pytest.param("2030-01-01T00:00:00+0100", id="offset-without-colon"),
        pytest.param("2030-01-01T00:00:00+01", id="offset-hours-only"),
        pytest.param("2030-01-01T00:00:00+24:00", id="offset-24h"),
        pytest.param("2030-01-01T00:00:00+01:00:30", id="offset-seconds"),
        pytest.param("2030-01-01T00:00:00,5Z", id="comma-fraction"),
        pytest.param("2030-01-01T00:00:00.Z", id="empty-fraction"),
        pytest.param("2030-01-01T24:00:00Z", id="hour-24"),
        pytest.param("2030-01-01T23:59:60Z", id="leap-second"),
        pytest.param("2030-02-29T00:00:00Z", id="not-a-leap-year"),
        pytest.param(" 2030-01-01T00:00:00Z", id="leading-space"),
        pytest.param("2030-01-01T00:00:00Z ", id="trailing-space"),
        pytest.param("2030-01-01T00:00:00Z\n", id="trailing-newline"),
        pytest.param("\uff12030-01-01T00:00:00Z", id="non-ascii-digit"),
        pytest.param("+2030-01-01T00:00:00Z", id="signed-year"),
    ],
)
def test_iso_8601_forms_outside_rfc_3339_are_refused(text: str) -> None:
    """Guarantee 4: deliver_at is RFC 3339 with an offset, not whatever ISO 8601 allows."""
    assert reason_of(timed(text)) == DeadLetterReason.INVALID_DELIVER_AT


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("2030-01-01t00:00:00z", NEW_YEAR_2030_MS),
        ("2030-01-01T00:00:00-00:00", NEW_YEAR_2030_MS),
        ("2030-01-01T00:00:00.0000000001Z", NEW_YEAR_2030_MS + 1),
        ("2030-01-01T00:00:00.999000000Z", NEW_YEAR_2030_MS + 999),
        ("2030-01-01T00:00:00.9991Z", NEW_YEAR_2030_MS + 1000),
        ("2028-02-29T12:00:00+23:59", 1_835_352_060_000),
        ("1970-01-01T00:00:00Z", 0),
    ],
)
def test_rfc_3339_edges_are_accepted(text: str, expected_ms: int) -> None:
    """RFC 3339 allows t/z in lower case, -00:00, any number of fraction digits (rounded up)."""
    at_ms = accepted(timed(text)).at_ms
    assert (at_ms, type(at_ms)) == (expected_ms, int)  # the codec packs it as a 64-bit int


non_rfc3339_forms = st.sampled_from(
    [
        "%Y%m%dT%H%M%SZ",
        "%Y-%m-%d %H:%M:%SZ",
        "%Y-%m-%dT%H:%MZ",
        "%Y-W%W-%wT%H:%M:%SZ",
        "%Y-%jT%H:%M:%SZ",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M:%S+0000",
        "%Y-%m-%d",
    ]
)


@PROPERTY
@given(moments, non_rfc3339_forms)
def test_any_iso_8601_form_outside_rfc_3339_is_refused(moment: datetime, form: str) -> None:
    """Guarantee 4: basic format, week and ordinal dates, no seconds or offset: refused."""
    assert reason_of(timed(moment.strftime(form))) == DeadLetterReason.INVALID_DELIVER_AT


@PROPERTY
@given(st.integers(min_value=0, max_value=2 * THOUSAND_YEARS_S * 1000))
def test_any_epoch_millisecond_as_text_and_number_is_that_millisecond(ms: int) -> None:
    """Epoch seconds with 3 decimals and the same instant in RFC 3339 name the same ms."""
    moment = EPOCH + timedelta(milliseconds=ms)
    assert accepted(timed(moment.isoformat(timespec="milliseconds"))).at_ms == ms
    number = f"{ms // 1000}.{ms % 1000:03d}".encode()
    value = b'{"topic":"orders","message":1,"deliver_at":' + number + b"}"
    assert accepted(value).at_ms == ms


@PROPERTY
@given(st.integers(min_value=2 * THOUSAND_YEARS_S + 1, max_value=253_402_300_799))
def test_any_time_beyond_2000_years_of_epoch_is_refused(seconds: int) -> None:
    """Guarantee 4: deliver_at past 1970 + 2,000 years is refused, as text and as a number."""
    moment = EPOCH + timedelta(seconds=seconds)
    assert reason_of(timed(moment.isoformat())) == DeadLetterReason.INVALID_DELIVER_AT
    assert reason_of(timed(seconds)) == DeadLetterReason.INVALID_DELIVER_AT


@pytest.mark.parametrize("seconds", [-1, -0.001, 1e300, 2**63 - 1])
def test_invalid_deliver_at_number(seconds: float) -> None:
    """Guarantee 4: epoch seconds before 1970 or absurdly far ahead are invalid_deliver_at."""
    assert reason_of(timed(seconds)) == DeadLetterReason.INVALID_DELIVER_AT


@pytest.mark.parametrize("at", [True, None, [1], {"s": 1}])
def test_deliver_at_of_the_wrong_type(at: object) -> None:
    """Guarantee 4: deliver_at that is neither text nor a number is wrong_type."""
    value = orjson.dumps({"topic": "orders", "message": 1, "deliver_at": at})
    assert reason_of(value) == DeadLetterReason.WRONG_TYPE


def test_countdown_and_deliver_at_together_conflict() -> None:
    """Guarantee 4: a record giving both countdown and deliver_at is conflicting_fields."""
    value = record(deliver_at="2030-01-01T00:00:00Z")
    assert reason_of(value) == DeadLetterReason.CONFLICTING_FIELDS


def test_due_ms_of_a_deliver_at_in_the_past_is_now() -> None:
    """A deliver_at already past fires at once: due_ms is never before the record arrived."""
    past = accepted(timed("2001-01-01T00:00:00Z"))
    assert past.due_ms(NEW_YEAR_2030_MS) == NEW_YEAR_2030_MS
    future = accepted(timed("2030-01-01T00:00:10Z"))
    assert future.due_ms(NEW_YEAR_2030_MS) == NEW_YEAR_2030_MS + 10_000


def test_due_ms_of_a_countdown_counts_from_receipt() -> None:
    """A countdown is due countdown_ms after the record was received."""
    assert accepted(record(countdown=2.5)).due_ms(1_000) == 3_500


@PROPERTY
@given(
    st.integers(min_value=0, max_value=2**50),
    st.none() | st.integers(min_value=0, max_value=2**50),
    st.none() | st.integers(min_value=0, max_value=2**50),
)
def test_due_ms_is_never_before_receipt(
    received: int, at: int | None, countdown: int | None
) -> None:
    """Envelope.due_ms: at_ms when still ahead, else receipt; or receipt plus countdown."""
    parsed = Envelope("orders", b"v", None, countdown_ms=countdown, at_ms=at)
    due = parsed.due_ms(received)
    assert due >= received
    if at is not None:
        assert due == max(at, received)
    else:
        assert due == received + (countdown or 0)


@PROPERTY
@given(moments)
def test_any_rfc3339_time_parses_to_its_exact_millisecond(moment: datetime) -> None:
    """RFC 3339 text with any ±hh:mm offset is due at its instant, rounded up to the ms."""
    assert accepted(timed(moment.isoformat())).at_ms == exact_ms(moment)


# JSON mode: message_base64, key, headers, id


def test_message_base64_is_delivered_byte_for_byte() -> None:
    """message_base64 carries a binary payload (NUL, 0xFF, every byte) unchanged."""
    payload = bytes(range(256)) * 2
    parsed = accepted(record(message=None, message_base64=base64.b64encode(payload).decode()))
    assert parsed.value == payload


def test_empty_message_base64_is_an_empty_payload() -> None:
    """An empty base64 string is a valid, empty payload."""
    assert accepted(record(message=None, message_base64="")).value == b""


def test_message_and_message_base64_together_conflict() -> None:
    """Guarantee 4: a record giving both message and message_base64 is conflicting_fields."""
    assert reason_of(record(message_base64="AA==")) == DeadLetterReason.CONFLICTING_FIELDS


@pytest.mark.parametrize("encoded", ["not base64!", "abc", "AA=A", "é", "AA==\n", "YQ"])
def test_bad_base64_is_invalid_base64(encoded: str) -> None:
    """Guarantee 4: message_base64 that is not strict base64 is invalid_base64."""
    value = record(message=None, message_base64=encoded)
    assert reason_of(value) == DeadLetterReason.INVALID_BASE64


@pytest.mark.parametrize("encoded", [5, True, ["AA=="], {"b": "AA=="}])
def test_message_base64_of_the_wrong_type(encoded: object) -> None:
    """Guarantee 4: message_base64 that is not a string is wrong_type."""
    assert reason_of(record(message=None, message_base64=encoded)) == DeadLetterReason.WRONG_TYPE


def test_key_is_delivered_as_utf8() -> None:
    """A string key becomes the delivered record's key, as UTF-8; no key means None."""
    assert accepted(record(key="customer-é")).key == "customer-é".encode()
    assert accepted(record(key="")).key == b""
    assert accepted(record()).key is None


@pytest.mark.parametrize("key", [5, True, ["k"], {"k": "v"}])
def test_key_of_the_wrong_type(key: object) -> None:
    """Guarantee 4: a key that is not a string is wrong_type."""
    assert reason_of(record(key=key)) == DeadLetterReason.WRONG_TYPE


def test_headers_are_kept_in_order_as_utf8() -> None:
    """A headers object becomes ordered (name, UTF-8 value) pairs on the delivered record."""
    parsed = accepted(record(headers={"trace": "1", "ü": "é", "empty": ""}))
    assert parsed.headers == (("trace", b"1"), ("ü", "é".encode()), ("empty", b""))


@pytest.mark.parametrize(
    "headers", [["trace", "1"], "trace=1", 5, {"trace": 1}, {"trace": None}, {"t": ["1"]}]
)
def test_headers_of_the_wrong_type(headers: object) -> None:
    """Guarantee 4: headers that are not an object of string values are wrong_type."""
    assert reason_of(record(headers=headers)) == DeadLetterReason.WRONG_TYPE


@pytest.mark.parametrize(
    "name", ["blackbox-id", "Blackbox-Attempt", "blackbox-", CALLER_HEADER, ""]
)
def test_reserved_header_names_are_invalid_header(name: str) -> None:
    """Guarantee 4: a sender may not forge blackbox-* or CALLER_SERVICE, nor send an empty name."""
    assert reason_of(record(headers={name: "x"})) == DeadLetterReason.INVALID_HEADER


def test_a_header_name_the_store_cannot_hold_is_invalid_header() -> None:
    """A header name longer than 65,535 UTF-8 bytes is refused at intake, not at the store."""
    longest = "h" * 0xFFFF
    assert accepted(record(headers={longest: "x"})).headers == ((longest, b"x"),)
    assert reason_of(record(headers={longest + "h": "x"})) == DeadLetterReason.INVALID_HEADER


def test_more_headers_than_the_store_can_hold_is_invalid_header() -> None:
    """More than 65,535 headers is refused at intake, not when the schedule is stored."""
    most = {f"h{i}": "" for i in range(0xFFFF)}
    assert len(accepted(record(headers=most)).headers) == 0xFFFF
    value = record(headers={**most, "one-more": ""})
    assert reason_of(value) == DeadLetterReason.INVALID_HEADER


@pytest.mark.parametrize(
    "schedule_id", ["order-42", "x" * MAX_ID_CHARS, "é" * MAX_ID_CHARS, "a b/c"]
)
def test_id_is_kept(schedule_id: str) -> None:
    """An id of 1-255 printable characters (multi-byte ones count once) is the schedule's id."""
    assert accepted(record(id=schedule_id)).schedule_id == schedule_id


def test_no_id_or_null_id_means_none() -> None:
    """Without an id (or with a null one) the intake coordinates will identify the schedule."""
    assert accepted(record()).schedule_id is None
    assert accepted(b'{"topic": "o", "message": 1, "countdown": 1, "id": null}').schedule_id is None


@pytest.mark.parametrize(
    "schedule_id", ["", "x" * (MAX_ID_CHARS + 1), "a\nb", "a\x00", "\u200b"], ids=repr
)
def test_invalid_id(schedule_id: str) -> None:
    """Guarantee 4: an empty, over-long or non-printable id is invalid_id."""
    assert reason_of(record(id=schedule_id)) == DeadLetterReason.INVALID_ID


@pytest.mark.parametrize("schedule_id", [42, True, ["a"], {"a": 1}])
def test_id_of_the_wrong_type(schedule_id: object) -> None:
    """Guarantee 4: an id that is not a string is wrong_type."""
    assert reason_of(record(id=schedule_id)) == DeadLetterReason.WRONG_TYPE


# Cancels


def test_json_cancel() -> None:
    """`{"id": X, "cancel": true}` cancels the sender's id X, whatever else is missing."""
    parsed = cancelled(b'{"id": "order-42", "cancel": true}', [(CALLER_HEADER, b"billing")])
    assert parsed == Cancel("order-42", b"billing")


def test_json_cancel_without_caller() -> None:
    """A cancel without CALLER_SERVICE cancels among ids sent without one (caller None)."""
    assert cancelled(b'{"id": "x", "cancel": true}') == Cancel("x", None)


def test_cancel_false_means_schedule() -> None:
    """`"cancel": false` on a full request schedules it as if the field were absent."""
    assert accepted(record(id="x", cancel=False)).schedule_id == "x"


@pytest.mark.parametrize("flag", [1, "true", None, [True]])
def test_cancel_of_the_wrong_type(flag: object) -> None:
    """Guarantee 4: a cancel flag that is not a boolean is wrong_type."""
    value = orjson.dumps({"id": "x", "cancel": flag})
    assert reason_of(value) == DeadLetterReason.WRONG_TYPE


def test_cancel_without_an_id() -> None:
    """Guarantee 4: a cancel without an id is missing_field; a bad id is invalid_id."""
    assert reason_of(b'{"cancel": true}') == DeadLetterReason.MISSING_FIELD
    assert reason_of(b'{"cancel": true, "id": ""}') == DeadLetterReason.INVALID_ID
    assert reason_of(b'{"cancel": true, "id": 5}') == DeadLetterReason.WRONG_TYPE


# Reschedules


def test_json_reschedule_moves_an_id_keeping_its_message() -> None:
    """`{"id": X, "reschedule": true, "countdown": N}` moves X (no topic, no message)."""
    value = b'{"id": "order-42", "reschedule": true, "countdown": 60}'
    parsed = envelope.parse(value, [(CALLER_HEADER, b"billing")], LIMITS)
    assert parsed == envelope.Reschedule("order-42", b"billing", countdown_ms=60_000)
    assert parsed.due_ms(1_000) == 61_000


def test_json_reschedule_to_an_instant() -> None:
    """A reschedule takes deliver_at as an envelope does; an instant gone fires at once."""
    value = b'{"id": "x", "reschedule": true, "deliver_at": "2030-01-01T00:00:00Z"}'
    parsed = envelope.parse(value, [], LIMITS)
    assert isinstance(parsed, envelope.Reschedule)
    assert parsed.at_ms == calendar.timegm((2030, 1, 1, 0, 0, 0)) * 1000
    assert parsed.due_ms(parsed.at_ms + 5) == parsed.at_ms + 5


@pytest.mark.parametrize(
    ("document", "reason"),
    [({"id": "x", "reschedule": True}, DeadLetterReason.MISSING_FIELD),
     ({"id": "x", "reschedule": 1, "countdown": 1}, DeadLetterReason.WRONG_TYPE),
     ({"reschedule": True, "countdown": 1}, DeadLetterReason.MISSING_FIELD),
     ({"id": "x", "reschedule": True, "countdown": -1}, DeadLetterReason.INVALID_COUNTDOWN),
     ({"id": "x", "reschedule": True, "countdown": 1, "deliver_at": 5},
      DeadLetterReason.CONFLICTING_FIELDS)],
)  # fmt: skip
def test_a_bad_reschedule_is_refused_with_its_reason(document: object, reason: object) -> None:
    """Guarantee 4: a reschedule without a due time, id or flag of the right type is
    dead-lettered with the reason an envelope would get."""
    assert reason_of(orjson.dumps(document)) == reason


def test_tombstone_with_a_key_cancels_that_id() -> None:
    """A record without a value whose key is an id cancels that id of the sender."""
    parsed = cancelled(None, [(CALLER_HEADER, b"billing")], b"order-42")
    assert parsed == Cancel("order-42", b"billing")


def test_tombstone_with_header_mode_headers_still_cancels() -> None:
    """An etf1 tombstone (its scheduler headers kept) cancels by key like any other."""
    assert cancelled(None, etf1(), b"job-1") == Cancel("job-1", None)


def test_tombstone_without_a_key_is_empty_value() -> None:
    """Guarantee 4: a record with neither value nor key is refused as empty_value."""
    assert reason_of(None) == DeadLetterReason.EMPTY_VALUE


@pytest.mark.parametrize("key", [b"\xff\xfe", b"", b"a\nb", b"x" * (MAX_ID_CHARS + 1)], ids=repr)
def test_tombstone_with_a_bad_key_is_invalid_id(key: bytes) -> None:
    """Guarantee 4: a tombstone whose key is not 1-255 printable UTF-8 characters is invalid_id."""
    assert reason_of(None, key=key) == DeadLetterReason.INVALID_ID


# Header mode (etf1's kafka-message-scheduler)


def test_header_mode_keeps_the_value_byte_for_byte() -> None:
    """In header mode the value is the payload as sent, non-UTF-8 bytes included."""
    payload = b"\xff\x00{not json\xc3"
    parsed = accepted(payload, etf1(), b"job-1")
    assert parsed == Envelope(
        topic="orders",
        value=payload,
        caller=None,
        at_ms=NEW_YEAR_2030_MS,
        schedule_id="job-1",
        etf1=True,
    )


def test_header_mode_epoch_may_be_fractional() -> None:
    """scheduler-epoch is unix seconds; a fraction is kept to the millisecond."""
    assert accepted(b"v", etf1(b"1893456000.25"), b"k").at_ms == NEW_YEAR_2030_MS + 250


def test_header_mode_without_a_record_key_is_invalid_id() -> None:
    """Guarantee 4: the record key is the schedule's id; without one the record is refused."""
    assert reason_of(b"v", etf1()) == DeadLetterReason.INVALID_ID


@pytest.mark.parametrize("key", [b"\xff", b"", b"a\tb"], ids=repr)
def test_header_mode_with_a_bad_record_key_is_invalid_id(key: bytes) -> None:
    """Guarantee 4: a record key that is not a valid id is invalid_id in header mode too."""
    assert reason_of(b"v", etf1(), key=key) == DeadLetterReason.INVALID_ID


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(etf1(epoch=None), id="no-epoch"),
        pytest.param(etf1(topic=None), id="no-target-topic"),
        pytest.param([(TARGET_KEY_HEADER, b"k")], id="target-key-only"),
    ],
)
def test_header_mode_missing_header(headers: list[Header]) -> None:
    """Guarantee 4: a header-mode record lacking scheduler-epoch or target-topic: missing_field."""
    assert reason_of(b"v", headers, key=b"id") == DeadLetterReason.MISSING_FIELD


@pytest.mark.parametrize("epoch", [b"soon", b"", b"2030-01-01T00:00:00Z", b"nan", b"inf", b"-1"])
def test_header_mode_unusable_epoch(epoch: bytes) -> None:
    """Guarantee 4: scheduler-epoch that is not usable unix seconds is invalid_deliver_at."""
    assert reason_of(b"v", etf1(epoch), key=b"id") == DeadLetterReason.INVALID_DELIVER_AT


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(etf1(b"\xff"), id="epoch-not-utf8"),
        pytest.param(etf1(None, b"orders", (EPOCH_HEADER, None)), id="epoch-without-value"),
        pytest.param(etf1(b"1", b"orders", (EPOCH_HEADER, b"2")), id="epoch-repeated"),
        pytest.param(etf1(b"1", b"orders", (TARGET_KEY_HEADER, None)), id="target-key-no-value"),
        pytest.param(etf1(b"1", b"orders", ("blackbox-id", b"forged")), id="reserved-passed"),
    ],
)
def test_header_mode_bad_headers_are_invalid_header(headers: list[Header]) -> None:
    """Guarantee 4: scheduler headers unreadable, repeated or empty, or forged blackbox-*."""
    assert reason_of(b"v", headers, key=b"id") == DeadLetterReason.INVALID_HEADER


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        (b"__consumer_offsets", DeadLetterReason.FORBIDDEN_TOPIC),
        (b"blackbox", DeadLetterReason.FORBIDDEN_TOPIC),
        (b"a b", DeadLetterReason.INVALID_TOPIC),
    ],
)
def test_header_mode_target_topic_is_checked(topic: bytes, reason: DeadLetterReason) -> None:
    """The target topic of a header-mode record is checked like a JSON one."""
    assert reason_of(b"v", etf1(b"1", topic), key=b"id") == reason


def test_header_mode_passes_other_headers_through() -> None:
    """Headers other than scheduler-* and CALLER_SERVICE go on to the delivered record, in order."""
    headers = etf1(
        b"1893456000",
        b"orders",
        ("trace", b"\xff"),
        (CALLER_HEADER, b"billing"),
        (TARGET_KEY_HEADER, b"k"),
        ("empty", None),
        ("trace", b"2"),
    )
    parsed = accepted(b"v", headers, b"job-1")
    assert parsed.headers == (("trace", b"\xff"), ("empty", None), ("trace", b"2"))
    assert parsed.caller == b"billing"


def test_header_mode_drops_etf1_output_headers() -> None:
    """scheduler-* headers etf1 sets on output (timestamp, key, topic) are not passed through:
    blackbox adds its own, so a copy from the sender would be a forged duplicate."""
    headers = etf1(
        b"1893456000",
        b"orders",
        ("scheduler-timestamp", b"1"),
        ("scheduler-key", b"forged"),
        ("scheduler-topic", b"elsewhere"),
    )
    assert accepted(b"v", headers, b"job-1").headers == ()


def test_header_mode_target_key_becomes_the_key() -> None:
    """scheduler-target-key is the delivered record's key (bytes as sent); absent means None."""
    with_key = etf1(b"1893456000", b"orders", (TARGET_KEY_HEADER, b"\x00k\xff"))
    assert accepted(b"v", with_key, b"job-1").key == b"\x00k\xff"
    assert accepted(b"v", etf1(), b"job-1").key is None


# Properties


def assert_parse_is_total(value: bytes | None, headers: Headers | None, key: bytes | None) -> None:
    """parse returns a request or raises InvalidEnvelope with a known reason; nothing else."""
    try:
        parsed = envelope.parse(value, headers, LIMITS, key)
    except InvalidEnvelope as e:
        assert e.reason in DeadLetterReason
        return
    assert isinstance(parsed, Envelope | Cancel)


@PROPERTY
@given(st.none() | st.binary(max_size=2048), st.none() | header_lists, record_keys)
def test_any_bytes_parse_or_refuse(
    value: bytes | None, headers: Headers | None, key: bytes | None
) -> None:
    """Guarantee 4: for any bytes, headers and key, parse returns a request or InvalidEnvelope."""
    assert_parse_is_total(value, headers, key)


@PROPERTY
@given(json_values, st.none() | header_lists, record_keys)
def test_any_json_parse_or_refuse(
    document: object, headers: Headers | None, key: bytes | None
) -> None:
    """Guarantee 4: for any JSON value, parse returns a request or raises InvalidEnvelope."""
    assert_parse_is_total(orjson.dumps(document), headers, key)


@PROPERTY
@given(envelope_like, st.none() | header_lists, record_keys)
def test_any_envelope_like_object_parse_or_refuse(
    document: dict[str, object], headers: Headers | None, key: bytes | None
) -> None:
    """Guarantee 4: objects with any mix of fields and types parse or raise InvalidEnvelope."""
    assert_parse_is_total(orjson.dumps(document), headers, key)


@PROPERTY
@given(
    st.binary(max_size=300),
    st.sampled_from([b"0", b"1893456000", b"1.5", b"-0", b"1e9", b" 12 "]) | st.binary(max_size=20),
    valid_topics.map(str.encode) | st.binary(max_size=20),
    header_lists,
    record_keys,
)
def test_any_header_mode_record_parses_or_refuses(
    value: bytes, epoch: bytes, topic: bytes, extra: list[Header], key: bytes | None
) -> None:
    """Guarantee 4: header-mode records with any epoch, topic, extras and key parse or refuse."""
    assert_parse_is_total(value, etf1(epoch, topic, *extra), key)


@PROPERTY
@given(
    value=st.binary(max_size=300),
    epoch=st.integers(min_value=0, max_value=2 * THOUSAND_YEARS_S),
    topic=valid_topics,
    schedule_id=ids,
    target_key=st.none() | st.binary(max_size=40),
    extra=st.lists(st.tuples(allowed_header_names, st.none() | st.binary(max_size=20)), max_size=4),
)
def test_header_mode_round_trips(  # noqa: PLR0913 - one argument per drawn part
    *,
    value: bytes,
    epoch: int,
    topic: str,
    schedule_id: str,
    target_key: bytes | None,
    extra: list[Header],
) -> None:
    """A valid header-mode record keeps value, due time, topic, id, key and other headers."""
    passed = [(n, v) for n, v in extra if not n.startswith("scheduler-")]
    key_header = [] if target_key is None else [(TARGET_KEY_HEADER, target_key)]
    headers = etf1(str(epoch).encode(), topic.encode(), *passed, *key_header)
    parsed = accepted(value, headers, schedule_id.encode())
    assert parsed == Envelope(
        topic=topic,
        value=value,
        caller=None,
        at_ms=epoch * 1000,
        key=target_key,
        headers=tuple(passed),
        schedule_id=schedule_id,
        etf1=True,
    )


@PROPERTY
@given(
    topic=valid_topics,
    message=json_values | st.binary(max_size=100),
    due=countdown_ms_values | moments,
    key=st.none() | st.text(max_size=20),
    headers=st.dictionaries(allowed_header_names, st.text(max_size=20), max_size=4),
    schedule_id=st.none() | ids,
    caller=st.none() | callers,
)
def test_valid_envelope_round_trips(  # noqa: PLR0913 - one argument per drawn field
    *,
    topic: str,
    message: object,
    due: int | datetime,
    key: str | None,
    headers: dict[str, str],
    schedule_id: str | None,
    caller: str | None,
) -> None:
    """A valid JSON request keeps topic, payload, due time, key, headers, id and caller."""
    document: dict[str, object] = {"topic": topic, "key": key, "id": schedule_id}
    if isinstance(message, bytes):
        document["message_base64"] = base64.b64encode(message).decode()
    else:
        document["message"] = message
    if isinstance(due, datetime):
        document["deliver_at"] = due.isoformat()
    else:
        document["countdown"] = due / 1000
    if headers:
        document["headers"] = headers
    caller_headers = None if caller is None else [(CALLER_HEADER, caller.encode())]
    parsed = accepted(orjson.dumps(document), caller_headers)
    assert parsed == Envelope(
        topic=topic,
        value=payload_of(message),
        caller=None if caller is None else caller.encode(),
        countdown_ms=None if isinstance(due, datetime) else due,
        at_ms=exact_ms(due) if isinstance(due, datetime) else None,
        key=None if key is None else key.encode(),
        headers=tuple((n, v.encode()) for n, v in headers.items()),
        schedule_id=schedule_id,
    )


def nested(field: str, depth: int) -> bytes:
    """A valid record whose `field` is `depth` arrays deep (the record itself is one more)."""
    inner = b"[" * depth + b"]" * depth
    return b'{"topic":"orders","countdown":1,"message":1,"' + field.encode() + b'":' + inner + b"}"


@PROPERTY
@given(st.integers(min_value=1, max_value=1100))
def test_a_record_nesting_1024_levels_parses_and_1025_is_invalid_json(depth: int) -> None:
    """Guarantee 4: JSON up to 1,024 levels deep is read; one more is invalid_json."""
    value = nested("extra", depth)
    if depth + 1 <= 1024:
        accepted(value)
    else:
        assert reason_of(value) == DeadLetterReason.INVALID_JSON


@PROPERTY
@given(st.integers(min_value=1, max_value=1100))
def test_a_message_too_deep_to_deliver_is_invalid_json_never_a_crash(depth: int) -> None:
    """Guarantee 4: a message nesting 254 levels is delivered; deeper is invalid_json, no crash."""
    value = nested("message", depth).replace(b'"message":1,', b"")
    if depth <= 254:
        assert accepted(value).value == b"[" * depth + b"]" * depth
    else:
        assert reason_of(value) == DeadLetterReason.INVALID_JSON


@PROPERTY
@given(st.integers(min_value=1, max_value=600), st.sampled_from(["x", "é", "\u4e2d"]))
def test_ids_and_callers_of_255_characters_are_accepted_and_256_refused(
    length: int, char: str
) -> None:
    """Guarantee 4: id and CALLER_SERVICE hold 1-255 characters, whatever their byte length."""
    text = char * length
    caller_headers = [(CALLER_HEADER, text.encode())]
    if length <= 255:
        assert accepted(record(id=text)).schedule_id == text
        assert accepted(record(), caller_headers).caller == text.encode()
    else:
        assert reason_of(record(id=text)) == DeadLetterReason.INVALID_ID
        assert reason_of(record(), caller_headers) == DeadLetterReason.INVALID_HEADER


@PROPERTY
@given(st.sampled_from(["blackbox-", "BLACKBOX-", "Blackbox-", "bLaCkBoX-"]), st.text(max_size=8))
def test_any_header_named_blackbox_in_any_case_is_reserved(prefix: str, rest: str) -> None:
    """Guarantee 2: no sender can forge a blackbox-* header (blackbox-id above all)."""
    assert reason_of(record(headers={prefix + rest: "x"})) == DeadLetterReason.INVALID_HEADER


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

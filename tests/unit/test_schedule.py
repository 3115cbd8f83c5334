"""Schedule encoding in Redis, and the stable ids of intake records (Guarantees 1 and 2)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blackbox.envelope import Envelope
from blackbox.errors import CorruptSchedule
from blackbox.schedule import Schedule, intake_id

PROPERTY = settings(max_examples=300, deadline=None, database=None)

json_values: st.SearchStrategy[object] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
headers_like: st.SearchStrategy[dict[str, object]] = st.fixed_dictionaries(
    {},
    optional={
        "t": st.text(max_size=10) | json_values,
        "d": st.integers(min_value=-(2**63), max_value=2**63 - 1) | json_values,
        "c": st.text(max_size=10) | json_values,
    },
)


@PROPERTY
@given(
    st.text(max_size=40),
    st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True),
    st.binary() | st.sampled_from([b"", b"\0", b"\0\0a\0", b'{"t":"x"}\0']),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.none() | st.text().map(str.encode),
)
def test_encode_decode_round_trip(
    schedule_id: str, topic: str, value: bytes, due_ms: int, caller: bytes | None
) -> None:
    """Guarantee 1: what is stored decodes to the same schedule, binary values (NULs) untouched."""
    schedule = Schedule(id=schedule_id, topic=topic, value=value, due_ms=due_ms, caller=caller)
    assert Schedule.decode(schedule_id, schedule.encode()) == schedule


def test_encoding_is_the_compact_binary_layout() -> None:
    """Version 1: u8 version, i64 due ms, u8 topic length + topic, u16 caller length + caller,
    then the value bytes as they are (no base64)."""
    schedule = Schedule("blackbox:0:7", "orders", b"\x00\xffraw", 1_700_000_000_000, b"billing")
    encoded = schedule.encode()
    assert encoded == (
        b"\x01" + (1_700_000_000_000).to_bytes(8, "big") + b"\x06orders"
        + b"\x00\x07billing" + b"\x00\xffraw"
    )  # fmt: skip
    assert len(encoded) - len(schedule.value) == 1 + 8 + 1 + 6 + 2 + 7


def test_encoding_without_caller_marks_it_absent() -> None:
    """A schedule without a caller stores the 0xFFFF marker and decodes with caller None."""
    encoded = Schedule("id", "orders", b"v", 5).encode()
    assert encoded[16:18] == b"\xff\xff"
    assert Schedule.decode("id", encoded).caller is None
    assert Schedule.decode("id", Schedule("id", "orders", b"v", 5, b"").encode()).caller == b""


def test_a_topic_longer_than_the_layout_allows_is_refused() -> None:
    """Topics are at most 249 bytes (Kafka's limit); the codec refuses longer ones clearly."""
    with pytest.raises(ValueError, match="topic"):
        Schedule("id", "t" * 256, b"v", 1).encode()


def test_topic_with_nul_character_survives() -> None:
    """orjson escapes a NUL in the header text, so the first raw NUL still ends the header."""
    schedule = Schedule("id", "a\0b", b"\0v", 1, b"c\0d")
    assert Schedule.decode("id", schedule.encode()) == schedule


def test_decode_uses_the_given_id() -> None:
    """The id is the Redis key's, not stored in the payload."""
    encoded = Schedule("old", "orders", b"v", 5).encode()
    assert Schedule.decode("new", encoded).id == "new"


def test_from_envelope_adds_countdown_to_receipt_time() -> None:
    """A schedule falls due countdown_ms after its intake record was received."""
    parsed = Envelope(topic="orders", value=b"v", countdown_ms=2500, caller=b"svc")
    schedule = Schedule.from_envelope("blackbox:1:9", parsed, received_ms=1_000_000)
    assert schedule == Schedule("blackbox:1:9", "orders", b"v", 1_002_500, b"svc")


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"not json", id="not-json"),
        pytest.param(b"\0value", id="empty-header"),
        pytest.param(b"\xff\xfe\0value", id="invalid-utf8-header"),
        pytest.param(b"[1, 2]\0value", id="array-header"),
        pytest.param(b'"text"\0value', id="string-header"),
        pytest.param(b"{}\0value", id="no-fields"),
        pytest.param(b'{"d": 1}\0value', id="no-topic"),
        pytest.param(b'{"t": "orders"}\0value', id="no-due"),
        pytest.param(b'{"t": "orders", "d": "soon"}\0value', id="due-text"),
        pytest.param(b'{"t": "orders", "d": null}\0value', id="due-null"),
        pytest.param(b'{"t": "orders", "d": [1]}\0value', id="due-array"),
        pytest.param(b'{"t": "orders", "d": 1, "c": 5}\0value', id="caller-number"),
        pytest.param(b'{"t": "orders", "d": 1, "c": ["a"]}\0value', id="caller-array"),
    ],
)
def test_decode_garbage_raises_corrupt_schedule(raw: bytes) -> None:
    """A payload blackbox did not write raises CorruptSchedule naming the id, cause chained."""
    with pytest.raises(CorruptSchedule, match="'bad-id'") as caught:
        Schedule.decode("bad-id", raw)
    assert caught.value.__cause__ is not None


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"t": 5, "d": 1}\0value', id="topic-number"),
        pytest.param(b'{"t": null, "d": 1}\0value', id="topic-null"),
        pytest.param(b'{"t": ["orders"], "d": 1}\0value', id="topic-array"),
    ],
)
def test_decode_refuses_a_topic_that_is_not_text(raw: bytes) -> None:
    """A stored topic that is not a string is corrupt (it could never be produced to)."""
    with pytest.raises(CorruptSchedule):
        Schedule.decode("bad-id", raw)


@PROPERTY
@given(headers_like, st.binary(max_size=20))
def test_decode_returns_a_well_typed_schedule_or_raises(
    header: dict[str, object], value: bytes
) -> None:
    """Decoding any JSON header gives a Schedule of the declared types, or CorruptSchedule."""
    try:
        schedule = Schedule.decode("id", orjson.dumps(header) + b"\0" + value)
    except CorruptSchedule:
        return
    assert isinstance(schedule.topic, str)
    assert isinstance(schedule.due_ms, int)
    assert schedule.caller is None or isinstance(schedule.caller, bytes)
    assert schedule.value == value


@PROPERTY
@given(st.binary(max_size=200))
def test_decode_any_bytes_never_raises_anything_else(raw: bytes) -> None:
    """Decoding arbitrary bytes returns a Schedule or raises CorruptSchedule, nothing else."""
    try:
        schedule = Schedule.decode("id", raw)
    except CorruptSchedule:
        return
    assert schedule.id == "id"


def test_intake_id_format() -> None:
    """Guarantee 2: an intake record's id is topic:partition:offset."""
    assert intake_id("blackbox", 3, 42) == "blackbox:3:42"


@settings(max_examples=100, deadline=None, database=None)
@given(
    st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True),
    st.integers(min_value=0, max_value=2**31 - 1),
    st.integers(min_value=0, max_value=2**63 - 1),
)
def test_intake_id_is_stable_and_unambiguous(topic: str, partition: int, offset: int) -> None:
    """Guarantee 2: re-reading a record gives the same id, and the id names exactly one record."""
    schedule_id = intake_id(topic, partition, offset)
    assert schedule_id == intake_id(topic, partition, offset)
    assert schedule_id.rsplit(":", 2) == [topic, str(partition), str(offset)]

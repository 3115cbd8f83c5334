"""Schedule encoding in Redis, and the stable ids of intake records (Guarantees 1 and 2)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blackbox.envelope import MAX_CALLER_CHARS, Envelope, Header
from blackbox.errors import CorruptSchedule
from blackbox.schedule import (
    CALLER_WITHIN,
    Schedule,
    caller_from_prefix,
    intake_id,
    origin_topic,
    scoped_id,
    split_scoped,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None)

topics = st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True)
due_times = st.integers(min_value=-(2**63), max_value=2**63 - 1)
values = st.binary() | st.sampled_from([b"", b"\0", b"\0\0a\0", b"\x01\x02"])
optional_bytes = st.none() | st.binary(max_size=300)
headers: st.SearchStrategy[tuple[Header, ...]] = st.lists(
    st.tuples(st.text(max_size=20), optional_bytes), max_size=5
).map(tuple)
origins = st.builds(
    intake_id,
    topics,
    st.integers(min_value=0, max_value=2**31 - 1),
    st.integers(min_value=0, max_value=2**63 - 1),
)
printable = st.text(
    alphabet=st.characters(exclude_categories=("C", "Z")) | st.just(" "),
    min_size=1,
    max_size=255,
)
callers = st.none() | printable.map(str.encode) | st.sampled_from([b"a/b", b"100%", b"a:b", b"@"])
rich_schedules = st.builds(
    Schedule,
    id=st.text(max_size=40),
    topic=topics,
    value=values,
    due_ms=due_times,
    caller=callers,
    key=optional_bytes,
    headers=headers,
    origin=st.none() | origins,
    sent_ms=st.none() | due_times,
    partition=st.none() | st.integers(0, 2**31 - 1),
)


def header_size(schedule: Schedule) -> int:
    """How many bytes of the encoding come before the value."""
    return len(schedule.encode()) - len(schedule.value)


@PROPERTY
@given(
    st.text(max_size=40),
    topics,
    values,
    due_times,
    st.none() | st.text().map(str.encode),
)
def test_encode_decode_round_trip(
    schedule_id: str, topic: str, value: bytes, due_ms: int, caller: bytes | None
) -> None:
    """Guarantee 1: what is stored decodes to the same schedule, binary values (NULs) untouched."""
    schedule = Schedule(id=schedule_id, topic=topic, value=value, due_ms=due_ms, caller=caller)
    assert Schedule.decode(schedule_id, schedule.encode()) == schedule


@PROPERTY
@given(rich_schedules)
def test_version_2_round_trip(schedule: Schedule) -> None:
    """Guarantee 1: key, headers (None values too), origin, sent_ms, caller, a target
    partition and a binary value all come back as they went in."""
    assert Schedule.decode(schedule.id, schedule.encode()) == schedule


@PROPERTY
@given(rich_schedules)
def test_every_truncated_header_is_corrupt(schedule: Schedule) -> None:
    """A stored schedule cut anywhere before its value raises CorruptSchedule, never a
    half-read schedule."""
    encoded = schedule.encode()
    for size in range(header_size(schedule)):
        with pytest.raises(CorruptSchedule):
            Schedule.decode("id", encoded[:size])


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


def test_version_2_layout() -> None:
    """Version 2: u8 version, i64 due ms, u8 flags, u8 topic length + topic, then each part its
    flag announces (caller, key, headers, origin, sent_ms) in that order, then the value."""
    schedule = Schedule(
        "@b/x", "t", b"\xffv", 5, b"b", b"k", (("h", b"v"), ("n", None)), "in:0:1", 7
    )
    assert schedule.encode() == (
        b"\x02" + (5).to_bytes(8, "big") + bytes([1 | 2 | 4 | 8 | 16]) + b"\x01t"
        + b"\x00\x01b"
        + b"\x00\x00\x00\x01k"
        + b"\x00\x02" + b"\x00\x01h\x00\x00\x00\x01v" + b"\x00\x01n\xff\xff\xff\xff"
        + b"\x00\x06in:0:1"
        + (7).to_bytes(8, "big")
        + b"\xffv"
    )  # fmt: skip


@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param(Schedule("id", "orders", b"v", 5), id="plain"),
        pytest.param(Schedule("id", "orders", b"v", 5, b"billing"), id="caller"),
    ],
)
def test_plain_schedules_stay_version_1(schedule: Schedule) -> None:
    """A schedule with nothing but topic, value, due time and caller keeps the version 1 layout,
    so schedules stored before version 2 and after look the same."""
    assert schedule.encode()[0] == 1


@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param(Schedule("id", "orders", b"v", 5, key=b"k"), id="key"),
        pytest.param(Schedule("id", "orders", b"v", 5, key=b""), id="empty-key"),
        pytest.param(Schedule("id", "orders", b"v", 5, headers=(("h", None),)), id="headers"),
        pytest.param(Schedule("@/x", "orders", b"v", 5, origin="in:0:1"), id="origin"),
        pytest.param(Schedule("id", "orders", b"v", 5, sent_ms=0), id="sent-ms"),
    ],
)
def test_richer_schedules_use_version_2(schedule: Schedule) -> None:
    """A key (even empty), headers, an origin or sent_ms need version 2, and survive it."""
    encoded = schedule.encode()
    assert encoded[0] == 2
    assert Schedule.decode(schedule.id, encoded) == schedule


def test_origin_topic_is_the_intake_topic_with_or_without_a_tag() -> None:
    """etf1's scheduler-topic header names the intake topic, whatever follows it."""
    assert origin_topic(intake_id("in.bound_x-1", 3, 42, "EhQ/z1Nx")) == "in.bound_x-1"
    assert origin_topic(intake_id("in.bound_x-1", 3, 42)) == "in.bound_x-1"


def test_the_longest_origin_round_trips() -> None:
    """An origin of a 249-character intake topic, the largest partition and offset, and
    the topic's incarnation tag fits."""
    origin = intake_id("t" * 249, 2**31 - 1, 2**63 - 1, "EhQ/z1Nx")
    schedule = Schedule("@/x", "orders", b"v", 5, origin=origin)
    assert Schedule.decode("@/x", schedule.encode()) == schedule


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


def test_nul_characters_survive() -> None:
    """Lengths, not separators, delimit the parts: NULs in topic, caller and value are data."""
    schedule = Schedule("id", "a\0b", b"\0v", 1, b"c\0d")
    assert Schedule.decode("id", schedule.encode()) == schedule


def test_decode_uses_the_given_id() -> None:
    """The id is the Redis key's, not stored in the payload."""
    encoded = Schedule("old", "orders", b"v", 5).encode()
    assert Schedule.decode("new", encoded).id == "new"


def test_from_envelope_adds_countdown_to_receipt_time() -> None:
    """A schedule falls due countdown_ms after its intake record was received."""
    parsed = Envelope(topic="orders", value=b"v", countdown_ms=2500, caller=b"svc")
    schedule = Schedule.from_envelope(
        parsed, "blackbox:1:9", received_ms=1_000_000, sent_ms=1_000_000
    )
    assert schedule == Schedule("blackbox:1:9", "orders", b"v", 1_002_500, b"svc")


def test_from_envelope_with_an_id_scopes_it_and_keeps_the_origin() -> None:
    """A caller's own id is stored scoped by the caller; the intake record is kept as origin."""
    parsed = Envelope(
        "orders", b"v", b"billing", at_ms=9_000, key=b"k", headers=(("h", b"1"),), schedule_id="42"
    )
    schedule = Schedule.from_envelope(parsed, "blackbox:0:3", received_ms=1_000, sent_ms=500)
    assert schedule == Schedule(
        "@billing/42", "orders", b"v", 9_000, b"billing", b"k", (("h", b"1"),), "blackbox:0:3"
    )
    assert schedule.version == "blackbox:0:3"


def test_from_envelope_keeps_sent_ms_for_header_mode_only() -> None:
    """etf1's scheduler-timestamp needs the intake record's time: kept for header mode only."""
    parsed = Envelope("orders", b"v", None, at_ms=9_000, schedule_id="job", etf1=True)
    schedule = Schedule.from_envelope(parsed, "blackbox:0:3", received_ms=1_000, sent_ms=500)
    assert (schedule.id, schedule.sent_ms) == ("@/job", 500)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00" + bytes(20), id="version-0"),
        pytest.param(b"\x03" + bytes(20), id="version-3"),
        pytest.param(b'{"t": "orders", "d": 1}\0value', id="json"),
        pytest.param(b"\x01\x00\x00", id="v1-due-truncated"),
        pytest.param(b"\x01" + bytes(8) + b"\x02\xff\xfe\xff\xff", id="v1-topic-not-utf8"),
        pytest.param(b"\x01" + bytes(8) + b"\x01t\x00\x09ab", id="v1-caller-truncated"),
        pytest.param(b"\x02" + bytes(8), id="v2-no-flags"),
        pytest.param(b"\x02" + bytes(8) + b"\x00\x01\xff", id="v2-topic-not-utf8"),
        pytest.param(b"\x02" + bytes(8) + b"\x02\x01t\x00\x00\x01", id="v2-key-length-cut"),
        pytest.param(
            b"\x02" + bytes(8) + b"\x04\x01t\x00\x01\x00\x01\xff\x00\x00\x00\x00",
            id="v2-header-name-not-utf8",
        ),
        pytest.param(b"\x02" + bytes(8) + b"\x08\x01t\x02\xff\xfe", id="v2-origin-not-utf8"),
        pytest.param(b"\x02" + bytes(8) + b"\x10\x01t\x00\x00", id="v2-sent-ms-cut"),
    ],
)
def test_decode_garbage_raises_corrupt_schedule(raw: bytes) -> None:
    """A payload blackbox did not write raises CorruptSchedule naming the id, cause chained."""
    with pytest.raises(CorruptSchedule, match="'bad-id'") as caught:
        Schedule.decode("bad-id", raw)
    assert caught.value.__cause__ is not None


@PROPERTY
@given(st.sampled_from([b"", b"\x01", b"\x02"]), st.binary(max_size=200))
def test_decode_any_bytes_never_raises_anything_else(version: bytes, rest: bytes) -> None:
    """Decoding arbitrary bytes returns a well-typed Schedule or raises CorruptSchedule."""
    try:
        schedule = Schedule.decode("id", version + rest)
    except CorruptSchedule:
        return
    assert schedule.id == "id"
    assert isinstance(schedule.topic, str)
    assert isinstance(schedule.due_ms, int)
    assert all(isinstance(name, str) for name, _ in schedule.headers)


def test_intake_id_format() -> None:
    """Guarantee 2: an intake record's id is topic:partition:offset."""
    assert intake_id("blackbox", 3, 42) == "blackbox:3:42"


@settings(max_examples=100, deadline=None, database=None)
@given(
    topics,
    st.integers(min_value=0, max_value=2**31 - 1),
    st.integers(min_value=0, max_value=2**63 - 1),
)
def test_intake_id_is_stable_and_unambiguous(topic: str, partition: int, offset: int) -> None:
    """Guarantee 2: re-reading a record gives the same id, and the id names exactly one record."""
    schedule_id = intake_id(topic, partition, offset)
    assert schedule_id == intake_id(topic, partition, offset)
    assert schedule_id.rsplit(":", 2) == [topic, str(partition), str(offset)]


@PROPERTY
@given(origins)
def test_intake_ids_are_never_taken_for_scoped_ids(origin: str) -> None:
    """An intake-derived id is not split into a caller and an id of its own."""
    assert split_scoped(origin) is None


@pytest.mark.parametrize(
    "caller",
    [None, b"billing", b"a/b", b"100%", b"%2F", b"a:b", b"@x", "été☃".encode(), b"a b"],
    ids=repr,
)
@pytest.mark.parametrize("schedule_id", ["order-42", "a/b/c", "@/x", ":0:1", "%41"])
def test_scoped_id_round_trips(caller: bytes | None, schedule_id: str) -> None:
    """A caller's id and its caller come back out of the stored id, whatever they contain."""
    assert split_scoped(scoped_id(caller, schedule_id)) == (caller, schedule_id)


def test_scoped_id_format() -> None:
    """A scoped id is `@caller/id`, the caller percent-encoded; no caller leaves it empty."""
    assert scoped_id(b"billing", "42") == "@billing/42"
    assert scoped_id(b"a/b", "42") == "@a%2Fb/42"
    assert scoped_id(None, "42") == "@/42"


@PROPERTY
@given(callers, printable)
def test_any_scoped_id_round_trips(caller: bytes | None, schedule_id: str) -> None:
    """Guarantee 2: any caller (or none) and any valid id survive scoping."""
    assert split_scoped(scoped_id(caller, schedule_id)) == (caller, schedule_id)


@PROPERTY
@given(callers, callers, printable)
def test_callers_do_not_share_ids(first: bytes | None, second: bytes | None, same: str) -> None:
    """Two callers using the same id get different stored ids: one cannot touch the other's."""
    assume(first != second)
    assert scoped_id(first, same) != scoped_id(second, same)


@pytest.mark.parametrize("key", [None, b"k"], ids=["version-1", "version-2"])
def test_a_topic_of_255_bytes_round_trips_in_both_versions(key: bytes | None) -> None:
    """The codec's topic length is an unsigned byte: 255 bytes fit, in version 1 and 2."""
    schedule = Schedule("id", "t" * 255, b"v", 5, b"billing", key=key)
    encoded = schedule.encode()
    assert encoded[0] == (1 if key is None else 2)
    assert Schedule.decode("id", encoded) == schedule


LONGEST_CALLER = ("\U0001f600" * MAX_CALLER_CHARS).encode()  # 4 bytes a character
LONG_V2 = Schedule("i", "t" * 249, b"v", 1, LONGEST_CALLER, key=b"k" * 3000,
                   headers=(("h" * 3000, b"x" * 3000),), origin="t:0:1", sent_ms=5)  # fmt: skip


@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param(Schedule("i", "t" * 249, b"v" * 5000, 1, LONGEST_CALLER), id="v1"),
        pytest.param(Schedule("i", "t", b"v" * 5000, 1, None), id="v1-no-caller"),
        pytest.param(LONG_V2, id="v2"),
        pytest.param(Schedule("i", "t", b"v", 1, None, key=b"k" * 3000), id="v2-no-caller"),
    ],
)
def test_the_caller_is_read_from_a_prefix_of_the_encoding(schedule: Schedule) -> None:
    """Guarantee 7: whose a schedule is comes from its first CALLER_WITHIN bytes (of either
    encoding), however long its key, headers and message: a check of another caller's id
    reads as little as a check of a free one."""
    encoded = schedule.encode()
    assert len(encoded) > CALLER_WITHIN
    assert caller_from_prefix(encoded[:CALLER_WITHIN]) == schedule.caller


@PROPERTY
@given(rich_schedules, st.binary(min_size=2100, max_size=2200))
def test_any_schedules_caller_is_in_its_prefix(schedule: Schedule, long: bytes) -> None:
    """The caller read from the prefix is the decoded schedule's, whatever follows it."""
    schedule.key = long
    encoded = schedule.encode()
    assert caller_from_prefix(encoded[:CALLER_WITHIN]) == schedule.caller


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x03" + bytes(20), b"\x01" + bytes(8) + b"\x01t\x00\x05ab",
     b"\x02" + bytes(8) + b"\x01\x01t\x00\x05ab", b"\x02" + bytes(8) + b"\x01\x05t"],
)  # fmt: skip
def test_a_caller_cut_short_in_the_prefix_is_corrupt(raw: bytes) -> None:
    """A prefix that cannot hold its caller raises CorruptSchedule, cause chained."""
    with pytest.raises(CorruptSchedule) as caught:
        caller_from_prefix(raw)
    assert caught.value.__cause__ is not None

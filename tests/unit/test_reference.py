"""Index mode's reference (blackbox/reference.py): its encoding, what reads the caller from
any payload, and the encoding a reference stands for; the store reader's runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blackbox.kafka.storereader import RUN_GAP, _runs
from blackbox.reference import Reference, is_reference, of, resolved
from blackbox.schedule import Schedule, caller_from_prefix

callers = st.none() | st.binary(max_size=40)


@given(
    due=st.integers(0, 2**62), partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**62), size=st.integers(0, 2**32 - 1), caller=callers,
)  # fmt: skip
def test_a_reference_decodes_to_what_was_encoded(
    due: int, partition: int, offset: int, size: int, caller: bytes | None
) -> None:
    ref = Reference(due, partition, offset, size, caller)
    raw = ref.encode()
    assert is_reference(raw)
    assert Reference.decode(raw) == ref
    assert len(raw) == 28 + len(caller or b"")
    assert caller_from_prefix(raw) == caller  # what quotas and the API's owner check read


def test_a_reference_is_never_taken_for_an_encoding_nor_the_reverse() -> None:
    encoded = Schedule("@c/a", "t", b"v", 5, caller=b"c").encode()
    assert not is_reference(encoded) and not is_reference(None) and not is_reference(b"")
    with pytest.raises(ValueError, match="not a reference"):
        Reference.decode(encoded + bytes(30))
    with pytest.raises(ValueError, match="bytes"):
        Reference.decode(b"\x03" + bytes(10))
    with pytest.raises(ValueError, match="truncated"):
        Reference.decode(Reference(1, 0, 0, 0, b"caller").encode()[:-2])


def test_a_reference_stands_for_its_records_encoding_at_its_own_due_time() -> None:
    """A move rewrites only Redis's copy: the record keeps the old time, the reference wins."""
    schedule = Schedule("@c/a", "t", b"\x00message", 1_000, caller=b"c", key=b"k",
                        headers=(("h", b"v"),))  # fmt: skip
    value = schedule.encode()
    ref = Reference.decode(of(value, 3, 42, b"c"))
    assert (ref.due_ms, ref.partition, ref.offset, ref.size) == (1_000, 3, 42, len(value))
    moved = Reference(9_000, 3, 42, len(value), b"c")
    back = Schedule.decode("@c/a", resolved(moved, value))
    assert back.due_ms == 9_000
    assert (back.value, back.key, back.headers, back.caller) == (
        schedule.value,
        schedule.key,
        schedule.headers,
        schedule.caller,
    )


def test_places_are_read_in_runs_of_one_partition_and_nearby_offsets() -> None:
    places = sorted([(0, 5), (0, 7), (0, 7 + RUN_GAP), (0, 8 + 2 * RUN_GAP + 1), (1, 0), (1, 3)])
    assert _runs(places) == [
        (0, [5, 7, 7 + RUN_GAP]), (0, [8 + 2 * RUN_GAP + 1]), (1, [0, 3]),
    ]  # fmt: skip
    assert _runs([]) == []

"""The crash guard's notes in a real Redis: what a dying intake leaves, and how the next
owner of the partition reads the offsets it died on."""

from __future__ import annotations

import pytest
import redis
from confluent_kafka import Message

from blackbox.intake.crashguard import CRASH_LIMIT, NOTE_AHEAD, CrashGuard, Suspect
from tests.kafkatools import unique, wait_until

TOPIC = "intake"


def _records(*offsets: int) -> list[Message]:
    return [Message(topic=TOPIC, partition=0, offset=o, value=b"v") for o in offsets]


def _offsets(records: list[Message]) -> list[int]:
    return [m.offset() or 0 for m in records]


def _owner(client: redis.Redis, key: str, ahead: int = 0) -> CrashGuard:
    """A new owner of partition 0; noting nothing ahead unless asked (the notes' exact
    offsets are what the tests below read)."""
    guard = CrashGuard(client, key, ahead)
    guard.assigned([(TOPIC, 0)])
    return guard


def _each_alone_to(client: redis.Redis, guard: CrashGuard, first: int, last: int) -> None:
    """The new owner reads from `first` on, two records past `last`: each offset of the
    suspect range is handled alone, charged while in hand and cleared once it ended; no
    note of the death is left after `last`."""
    for offset in range(first, last + 1):
        now, later = guard.careful(_records(*range(offset, last + 3)))
        assert (_offsets(now), _offsets(later)) == ([offset], list(range(offset + 1, last + 3)))
        assert guard.note(now) == {}
        assert client.hget(guard.key, f"{TOPIC}:0") == f"{offset} {last} 1".encode()
        guard.ended(now)
    assert client.hget(guard.key, f"{TOPIC}:0") is None


def test_a_clean_owner_handles_whole_polls_and_leaves_no_note(redis_client: redis.Redis) -> None:
    """Guarantee 4: without a death, polls are handled whole and a clean stop deletes the
    notes (the next owner is not slowed down)."""
    key = unique("handling")
    guard = _owner(redis_client, key)
    now, later = guard.careful(_records(0, 1, 2))
    assert (_offsets(now), later) == ([0, 1, 2], [])
    assert guard.note(now) == {}
    assert redis_client.hget(key, f"{TOPIC}:0") == b"0 2 0"  # many in hand: none charged
    guard.stopped()
    assert redis_client.exists(key) == 0


def test_the_next_owner_takes_the_offsets_died_on_one_at_a_time(
    redis_client: redis.Redis,
) -> None:
    """Guarantee 4: after a death in a poll of offsets 10-14, the next owner handles 10, then
    11, ... alone, each charged while in hand and cleared once it ended, and after 14 whole
    polls again with no note left of the death."""
    key = unique("handling")
    _owner(redis_client, key).note(_records(10, 11, 12, 13, 14))  # then died
    guard = _owner(redis_client, key)
    _each_alone_to(redis_client, guard, 10, 14)
    now, later = guard.careful(_records(15, 16))
    assert (_offsets(now), later) == ([15, 16], [])


def test_a_record_that_died_crash_limit_times_alone_is_set_aside(
    redis_client: redis.Redis,
) -> None:
    """Guarantee 4: record 12 kills every owner; once it died CRASH_LIMIT times alone it is
    returned as poisoned (to be dead-lettered unparsed, its headers read), not handled
    again; the records before it, handled alone too, are never charged."""
    key = unique("handling")
    _owner(redis_client, key).note(_records(10, 11, 12, 13))  # died in the poll
    poisoned: dict[tuple[str, int, int], bool] = {}
    deaths = 0
    while not poisoned:
        guard = _owner(redis_client, key)
        # The last owner committed nothing past 10: the records before 12 come again.
        now, _ = guard.careful(_records(10, 11, 12, 13))
        while _offsets(now) != [12]:
            assert guard.note(now) == {}
            guard.ended(now)
            now, _ = guard.careful(_records(*range(max(_offsets(now)) + 1, 14)))
        poisoned = guard.note(now)
        guard.died()
        deaths += 1
        assert deaths <= CRASH_LIMIT + 1
    assert poisoned == {(TOPIC, 0, 12): True}
    assert deaths == CRASH_LIMIT + 1  # CRASH_LIMIT deaths alone, then set aside


def test_a_retry_in_the_same_process_is_not_a_death(redis_client: redis.Redis) -> None:
    """Guarantee 5 beside 4: a poll retried after Redis or the broker failed is noted again
    with the same count, so an outage never makes a good record poisoned."""
    key = unique("handling")
    _owner(redis_client, key).note(_records(7, 8))  # died
    guard = _owner(redis_client, key)
    now, _ = guard.careful(_records(7, 8))
    for _ in range(CRASH_LIMIT + 2):
        assert guard.note(now) == {}
    assert redis_client.hget(key, f"{TOPIC}:0") == b"7 8 1"


def test_a_caught_failure_is_not_counted_as_a_death(redis_client: redis.Redis) -> None:
    """Guarantee 5 beside 4: a poll that failed for Redis or the broker (caught, backing
    off) puts its notes back as they were, so killing a paused intake a few times never
    sets a good record aside as unreadable."""
    key = unique("handling")
    plain = _owner(redis_client, key)
    now, _ = plain.careful(_records(0, 1))
    plain.note(now)
    plain.interrupted(now)
    assert redis_client.hget(key, f"{TOPIC}:0") is None
    _owner(redis_client, key).note(_records(7, 8))  # died
    careful = _owner(redis_client, key)
    now, _ = careful.careful(_records(7, 8))
    careful.note(now)
    assert redis_client.hget(key, f"{TOPIC}:0") == b"7 8 1"
    careful.interrupted(now)
    assert redis_client.hget(key, f"{TOPIC}:0") == b"7 8 0"


def test_a_revoke_keeps_an_unresolved_death_for_the_next_owner(
    redis_client: redis.Redis,
) -> None:
    """Guarantee 4: a partition given away while its suspect record is not yet handled keeps
    its note; one given away cleanly loses it."""
    key = unique("handling")
    _owner(redis_client, key).note(_records(3, 4))  # died
    guard = _owner(redis_client, key)
    guard.careful(_records(3, 4))
    guard.revoked([(TOPIC, 0)])
    assert redis_client.hget(key, f"{TOPIC}:0") == b"3 4 0"


Where = tuple[str, int, int]


def _poll(positions: dict[int, int], ends: dict[int, int]) -> list[Message]:
    """What a consumer at `positions` fetches: each partition's records up to its end."""
    return [Message(topic=TOPIC, partition=p, offset=o, value=b"v")
            for p in sorted(positions) for o in range(positions[p], ends[p])]  # fmt: skip


def _life(
    guard: CrashGuard, committed: dict[int, int], ends: dict[int, int], killer: Where
) -> tuple[bool, dict[Where, bool]]:
    """`guard` the new owner of every partition, from the committed offsets: whether it
    died (on the killer), and the records it set aside."""
    guard.assigned([(TOPIC, p) for p in committed])
    positions, set_aside = dict(committed), dict[Where, bool]()
    while positions != ends:
        now, _ = guard.careful(_poll(positions, ends))
        poisoned = guard.note(now)
        if killer in {(TOPIC, m.partition(), m.offset()) for m in now} - poisoned.keys():
            guard.died()
            return True, set_aside
        set_aside |= poisoned
        guard.ended(now)
        positions.update({m.partition() or 0: (m.offset() or 0) + 1 for m in now})
    guard.stopped()
    return False, set_aside


def _charged(client: redis.Redis, key: str) -> set[str]:
    """The partitions whose note charges a death to a record."""
    charged = set()
    for field, note in client.hgetall(key).items():
        suspect = Suspect.decode(note)
        if suspect is None or suspect.attempts > 0:
            charged.add(field.decode() if isinstance(field, bytes) else field)
    return charged


@pytest.mark.parametrize("ahead", [0, NOTE_AHEAD])
def test_a_death_is_charged_only_to_the_record_handled_alone(
    redis_client: redis.Redis, ahead: int
) -> None:
    """Guarantee 4, one caller never harms another: a record on partition 3 that kills the
    intake, polled with good records of partitions 0-2 and committed nothing since, is
    the only record set aside (its headers read), after CRASH_LIMIT deaths alone; the
    good records, read again after every death, are never charged one. Whether the notes
    hold only the offsets in hand or more past them, as the defaults do."""
    key = unique("handling")
    committed = {p: 5 for p in range(4)}
    ends = {p: 8 for p in range(4)}
    killer = (TOPIC, 3, 5)
    deaths, set_aside = 0, dict[Where, bool]()
    while True:
        died, set_aside = _life(CrashGuard(redis_client, key, ahead), committed, ends, killer)
        if not died:
            break
        deaths += 1
        assert deaths <= CRASH_LIMIT + 1, "the killer was never set aside"
        assert _charged(redis_client, key) <= {f"{TOPIC}:3"}, "a death charged to a good record"
    assert set_aside == {killer: True}
    assert deaths == CRASH_LIMIT + 1  # the poll of many, then CRASH_LIMIT deaths alone
    # What stays: notes of offsets ahead of the ends never reached, charging nothing.
    assert _charged(redis_client, key) == set()
    assert ahead or redis_client.exists(key) == 0


def test_a_record_whose_setting_aside_died_is_set_aside_unread(redis_client: redis.Redis) -> None:
    """Guarantee 4: reading a killer's headers may be what kills; if setting it aside died
    too, the next owner sets it aside without reading them, rather than dying forever."""
    key = unique("handling")
    redis_client.hset(key, f"{TOPIC}:0", Suspect(4, 4, CRASH_LIMIT).encode())
    guard = _owner(redis_client, key)
    now, _ = guard.careful(_records(4, 5))
    assert guard.note(now) == {(TOPIC, 0, 4): True}
    guard.died()  # while setting it aside
    guard = _owner(redis_client, key)
    now, _ = guard.careful(_records(4, 5))
    assert guard.note(now) == {(TOPIC, 0, 4): False}
    guard.ended(now)
    assert redis_client.hget(key, f"{TOPIC}:0") is None


def test_a_steady_stream_writes_one_note_per_range_ahead(redis_client: redis.Redis) -> None:
    """The polls that follow within the offsets noted ahead write nothing (seen here by
    deleting the note between polls); the first poll past them notes again from its own
    first offset."""
    key = unique("handling")
    guard = _owner(redis_client, key, NOTE_AHEAD)
    now, _ = guard.careful(_records(0, 1, 2))
    assert guard.note(now) == {}
    assert redis_client.hget(key, f"{TOPIC}:0") == f"0 {2 + NOTE_AHEAD} 0".encode()
    redis_client.delete(key)
    for first in range(3, NOTE_AHEAD - 20, 20):  # to offset 2 + NOTE_AHEAD at most
        assert guard.note(_records(*range(first, first + 20))) == {}
    assert redis_client.exists(key) == 0
    past = NOTE_AHEAD + 3
    guard.note(_records(past - 1, past))
    assert redis_client.hget(key, f"{TOPIC}:0") == f"{past - 1} {past + NOTE_AHEAD} 0".encode()


def test_a_death_within_a_range_noted_ahead_leaves_each_record_to_be_handled_alone(
    redis_client: redis.Redis,
) -> None:
    """Guarantee 4 with notes ahead: an owner dies in a poll it wrote no note for (its
    offsets were noted with an earlier poll); the next owner, from the committed offset,
    handles every record to the end of the range alone, charging the one in hand at each
    death, then whole polls again without a note of the death left."""
    key = unique("handling")
    dead = _owner(redis_client, key, 4)
    dead.note(_records(10, 11))  # noted 10 to 15
    dead.ended(_records(10, 11))  # handled and committed: the next poll starts at 12
    dead.note(_records(12, 13))  # within the range: nothing written, then it died
    assert redis_client.hget(key, f"{TOPIC}:0") == b"10 15 0"
    guard = _owner(redis_client, key, 4)
    _each_alone_to(redis_client, guard, 12, 15)
    now, later = guard.careful(_records(16, 17))
    assert (_offsets(now), later) == ([16, 17], [])
    guard.note(now)
    assert redis_client.hget(key, f"{TOPIC}:0") == b"16 21 0"


def test_a_caught_failure_makes_the_next_poll_note_again(redis_client: redis.Redis) -> None:
    """A poll interrupted by a caught failure deletes its note: the poll read again must
    note again, though its offsets lie within the range noted before (else a death while
    handling it would leave no note, and the killer would come back forever)."""
    key = unique("handling")
    guard = _owner(redis_client, key, NOTE_AHEAD)
    now, _ = guard.careful(_records(0, 1))
    guard.note(now)
    guard.interrupted(now)
    assert redis_client.hget(key, f"{TOPIC}:0") is None
    guard.note(_records(0, 1))
    assert redis_client.hget(key, f"{TOPIC}:0") == f"0 {1 + NOTE_AHEAD} 0".encode()


def test_a_late_revoke_leaves_the_note_of_the_partition_s_next_owner(
    redis_client: redis.Redis,
) -> None:
    """An owner that stalled past its session serves its revoke late, after the group gave
    the partition to another: it deletes only the note it wrote, not its successor's."""
    key = unique("handling")
    stalled = _owner(redis_client, key, NOTE_AHEAD)
    now, _ = stalled.careful(_records(0, 1))
    stalled.note(now)
    redis_client.hset(key, f"{TOPIC}:0", f"2 {3 + NOTE_AHEAD} 0")  # the next owner's
    stalled.revoked([(TOPIC, 0)])
    assert redis_client.hget(key, f"{TOPIC}:0") == f"2 {3 + NOTE_AHEAD} 0".encode()
    clean = _owner(redis_client, unique("handling"), NOTE_AHEAD)  # on time: its note goes
    now, _ = clean.careful(_records(5, 6))
    clean.note(now)
    clean.revoked([(TOPIC, 0)])
    assert redis_client.exists(clean.key) == 0


def test_a_note_lost_with_redis_is_written_again_within_the_refresh_or_at_a_seek(
    redis_client: redis.Redis,
) -> None:
    """A Redis that failed over may lose a note without intake meeting an error: the polls
    within the range write it again once it is `refresh_seconds` old, and at once after the
    consumer was moved (gaps.py's re-read seeks)."""
    key = unique("handling")
    guard = _owner(redis_client, key, NOTE_AHEAD)
    guard.refresh_seconds = 0.2
    now, _ = guard.careful(_records(0, 1))
    guard.note(now)
    redis_client.delete(key)  # lost with the old primary
    guard.note(_records(2, 3))
    assert redis_client.hget(key, f"{TOPIC}:0") is None  # within the range and fresh
    offsets = iter(range(4, 200))

    def noted_again() -> bool:
        offset = next(offsets)
        guard.note(_records(offset))
        return redis_client.hget(key, f"{TOPIC}:0") is not None

    wait_until(noted_again, 5, "the note written again")
    redis_client.delete(key)
    guard.moved([(TOPIC, 0)])
    guard.note(_records(2, 3))
    assert redis_client.hget(key, f"{TOPIC}:0") == f"2 {3 + NOTE_AHEAD} 0".encode()

"""The crash guard's notes in a real Redis: what a dying intake leaves, and how the next
owner of the partition reads the offsets it died on."""

from __future__ import annotations

import redis
from confluent_kafka import Message

from blackbox.intake.crashguard import CRASH_LIMIT, CrashGuard
from tests.kafkatools import unique

TOPIC = "intake"


def _records(*offsets: int) -> list[Message]:
    return [Message(topic=TOPIC, partition=0, offset=o, value=b"v") for o in offsets]


def _offsets(records: list[Message]) -> list[int]:
    return [m.offset() or 0 for m in records]


def _owner(client: redis.Redis, key: str) -> CrashGuard:
    guard = CrashGuard(client, key)
    guard.assigned([(TOPIC, 0)])
    return guard


def test_a_clean_owner_handles_whole_polls_and_leaves_no_note(redis_client: redis.Redis) -> None:
    """Guarantee 4: without a death, polls are handled whole and a clean stop deletes the
    notes (the next owner is not slowed down)."""
    key = unique("handling")
    guard = _owner(redis_client, key)
    now, later = guard.careful(_records(0, 1, 2))
    assert (_offsets(now), later) == ([0, 1, 2], [])
    assert guard.note(now) == set()
    assert redis_client.hget(key, f"{TOPIC}:0") == b"0 2 1"
    guard.stopped()
    assert redis_client.exists(key) == 0


def test_the_next_owner_takes_the_offsets_died_on_one_at_a_time(
    redis_client: redis.Redis,
) -> None:
    """Guarantee 4: after a death in a poll of offsets 10-14, the next owner handles 10, then
    11, ... alone, and after 14 whole polls again."""
    key = unique("handling")
    _owner(redis_client, key).note(_records(10, 11, 12, 13, 14))  # then died
    guard = _owner(redis_client, key)
    for offset in range(10, 15):
        now, later = guard.careful(_records(*range(offset, 16)))
        assert (_offsets(now), _offsets(later)) == ([offset], list(range(offset + 1, 16)))
        assert guard.note(now) == set()
    now, later = guard.careful(_records(15, 16))
    assert (_offsets(now), later) == ([15, 16], [])


def test_a_record_that_died_crash_limit_times_alone_is_set_aside(
    redis_client: redis.Redis,
) -> None:
    """Guarantee 4: record 12 kills every owner; once it died CRASH_LIMIT times alone it is
    returned as poisoned (to be dead-lettered unread), not handled again."""
    key = unique("handling")
    _owner(redis_client, key).note(_records(10, 11, 12, 13))  # died in the poll
    poisoned: set[tuple[str, int, int]] = set()
    deaths = 0
    while not poisoned:
        guard = _owner(redis_client, key)
        # The last owner committed nothing past 10: the records before 12 come again.
        now, _ = guard.careful(_records(10, 11, 12, 13))
        while _offsets(now) != [12]:
            assert guard.note(now) == set()
            now, _ = guard.careful(_records(*range(max(_offsets(now)) + 1, 14)))
        poisoned = guard.note(now)
        guard.died()
        deaths += 1
        assert deaths <= CRASH_LIMIT + 1
    assert poisoned == {(TOPIC, 0, 12)}
    assert deaths == CRASH_LIMIT + 1  # CRASH_LIMIT deaths alone, then set aside


def test_a_retry_in_the_same_process_is_not_a_death(redis_client: redis.Redis) -> None:
    """Guarantee 5 beside 4: a poll retried after Redis or the broker failed is noted again
    with the same count, so an outage never makes a good record poisoned."""
    key = unique("handling")
    _owner(redis_client, key).note(_records(7, 8))  # died
    guard = _owner(redis_client, key)
    now, _ = guard.careful(_records(7, 8))
    for _ in range(CRASH_LIMIT + 2):
        assert guard.note(now) == set()
    assert redis_client.hget(key, f"{TOPIC}:0") == b"7 8 2"


def test_a_caught_failure_is_not_counted_as_a_death(redis_client: redis.Redis) -> None:
    """Guarantee 5 beside 4: a poll that failed for Redis or the broker (caught, backing
    off) puts its notes back as they were, so killing a paused intake a few times never
    sets a good record aside as unreadable."""
    key = unique("handling")
    plain = _owner(redis_client, key)
    plain.note(_records(0, 1))
    plain.interrupted(_records(0, 1))
    assert redis_client.hget(key, f"{TOPIC}:0") is None
    _owner(redis_client, key).note(_records(7, 8))  # died
    careful = _owner(redis_client, key)
    now, _ = careful.careful(_records(7, 8))
    careful.note(now)
    assert redis_client.hget(key, f"{TOPIC}:0") == b"7 8 2"
    careful.interrupted(now)
    assert redis_client.hget(key, f"{TOPIC}:0") == b"7 8 1"


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
    assert redis_client.hget(key, f"{TOPIC}:0") == b"3 4 1"

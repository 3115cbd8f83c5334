"""Restating (intake/restating.py) on a real Redis: which notes of a restate set are taken,
by Redis's clock, and which are left; the store writes themselves are test_store_topic's."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import cast

import redis

from blackbox.intake.keeping import Keeping
from blackbox.intake.restating import STALE_MS, Restating
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.kafkatools import unique

OWNED = ("intake", 0)
WAIT_S = 30.0  # the delivery timeout: notes are taken 35 s after they were made


class Restated:
    """Stands for Keeping where only the ids asked for matter: records them, and runs
    `during` as a store write would take its time."""

    def __init__(self, during: Callable[[], object] = lambda: None) -> None:
        self.ids: list[str] = []
        self.during = during

    def restate(
        self, stale: Sequence[str], stop: threading.Event, cancelled: Collection[str] = ()
    ) -> None:
        self.ids += stale
        self.during()


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _store(client: redis.Redis) -> RedisStore:
    return RedisStore(client, Layout(unique("ns"), 1), grace_seconds=60)


def test_notes_are_taken_by_redis_s_clock_of_owned_partitions_or_once_stale(
    redis_client: redis.Redis,
) -> None:
    """Notes are aged by the clock intake.lua scored them by (Redis's): an owned partition's
    note is taken once the wait passed, not before; another partition's only once stale."""
    store, restated = _store(redis_client), Restated()
    restating = Restating(store, cast(Keeping, restated), WAIT_S)
    key, now = store.layout.shards[0].restate, _redis_ms(redis_client)
    wait_ms = int(WAIT_S * 1000) + 5_000
    redis_client.zadd(key, {
        "intake:0|@c/due": now - wait_ms - 1_000,
        "intake:0|@c/young": now - wait_ms + 60_000,
        "other:3|@c/elsewhere": now - wait_ms - 1_000,
        "other:3:tag|@c/stale": now - STALE_MS - 1_000,
    })  # fmt: skip

    assert restating.run({OWNED}, threading.Event()) == 2

    assert sorted(restated.ids) == ["@c/due", "@c/stale"]
    assert sorted(redis_client.zrange(key, 0, -1)) == [b"intake:0|@c/young",
                                                       b"other:3|@c/elsewhere"]  # fmt: skip


def test_a_note_made_again_while_it_is_restated_stays_for_its_own_turn(
    redis_client: redis.Redis,
) -> None:
    """The id is stored anew once more while its last note is being restated: the newer
    note is not removed with the one taken."""
    store = _store(redis_client)
    key, member = store.layout.shards[0].restate, "intake:0|@c/again"
    restated = Restated(during=lambda: redis_client.zadd(key, {member: _redis_ms(redis_client)}))
    restating = Restating(store, cast(Keeping, restated), WAIT_S)
    redis_client.zadd(key, {member: _redis_ms(redis_client) - STALE_MS})

    assert restating.run({OWNED}, threading.Event()) == 1

    assert restated.ids == ["@c/again"]
    assert redis_client.zscore(key, member) is not None

"""Attack: a series paused, cancelled or replaced while one of its occurrences is in flight
(claimed ahead of its due time, BLACKBOX_FIRE_AHEAD_MS, and being produced). Redis keeps
the pause, ends the cancelled series and keeps the replacement (advance.lua); the store
must end with exactly that too, and a rebuild must not bring a cancelled series back."""

from __future__ import annotations

import time

import redis

from blackbox.intake import rebuild
from tests.integration.conftest import (
    ReaderFactory,
    ServiceFactory,
    wipe_namespace,
    with_store_topic,
)
from tests.integration.store_attack_tools import send, settled_differences, sid
from tests.integration.test_store_topic import redis_pending
from tests.kafkatools import unique

EVERY_S = 4
NAMES = ("s-pause", "s-cancel", "s-update", "s-plain")


def test_a_series_held_cancelled_or_replaced_in_flight_leaves_the_store_as_redis(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    env = with_store_topic(env)
    overrides = {"BLACKBOX_STORE_TOPIC": env["BLACKBOX_STORE_TOPIC"],
                 "BLACKBOX_FIRE_AHEAD_MS": "1000"}  # fmt: skip
    service = start_service(**overrides)
    target = reader(unique("target"))
    send(env, *[{"id": n, "topic": target.topic, "message": n, "every": EVERY_S}
                for n in NAMES])  # fmt: skip
    first = target.wait_count(len(NAMES), timeout=20)
    next_due_ms = max(int(r.header("blackbox-due-ms")) for r in first) + EVERY_S * 1000
    # A one-off due 0.8 s before them wakes the dispatcher, whose claim then takes what
    # falls due within the next second: the second occurrences, held in flight till due.
    send(env, {"id": "bait", "topic": target.topic, "message": "bait",
               "deliver_at": (next_due_ms - 800) / 1000})  # fmt: skip
    time.sleep(max(0.0, (next_due_ms - 400) / 1000 - time.time()))
    send(env, {"id": "s-pause", "pause": True}, {"id": "s-cancel", "cancel": True},
         {"id": "s-update", "topic": target.topic, "message": "v2", "every": 3600})  # fmt: skip
    target.wait_count(2 * len(NAMES) + 1, timeout=20)  # each second occurrence was delivered
    delivered = [r.value for r in target.read_to_end()]
    assert delivered.count(b"s-cancel") == 2, delivered  # the second was in flight
    pending = redis_pending(service)
    assert sid("s-cancel") not in pending
    assert pending[sid("s-pause")][9] & 64, "Redis keeps the pause (advance.lua)"
    assert b"v2" in pending[sid("s-update")]

    found = settled_differences(service, env)
    assert found == {}, {k: (str(a)[:40], str(b)[:40]) for k, (a, b) in found.items()}

    # A flush and a rebuild from the store: the cancelled series must stay ended.
    service.stop()
    wipe_namespace(redis_client, service.settings.namespace)
    rebuild.rebuild(service.settings)
    assert sid("s-cancel") not in redis_pending(service)

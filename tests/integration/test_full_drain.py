"""A Redis that fills up drains itself: with `maxmemory` a few MB and noeviction, intake
waits while firing goes on, every due message is delivered, and intake resumes by itself
as firing frees memory."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
import pytest
import redis

from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.service import Service
from blackbox.storage.keys import Keys
from tests.integration.conftest import ReaderFactory, ServiceFactory, service_env
from tests.kafkatools import Received, envelope, produce, unique, wait_until

MAXMEMORY = "4mb"
MESSAGES = 12_000
COUNTDOWN_S = 3
DEADLINE_S = 45
OVER_BYTES = 128 * 1024


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[RedisServer]:
    config = {"maxmemory": MAXMEMORY, "maxmemory-policy": "noeviction"}
    server = RedisServer(free_port(), tmp_path, config=config)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def env(small_redis: RedisServer, broker: KafkaBroker) -> dict[str, str]:
    """The service's environment, on the small Redis (start_service uses it)."""
    return service_env(small_redis.url, broker.bootstrap)


@dataclass(frozen=True)
class Figures:
    """What the test measured, from the samples: pending when intake first waited for
    memory, delivered while it waited, how long it waited, and until nothing was pending."""

    pending_at_pause: int
    delivered_at_pause: int
    delivered_while_full: int
    seconds_full: float
    seconds_from_pause_to_drained: float
    ready_said_full: bool


@dataclass
class Watch:
    """What the service said every 20 ms: whether intake waited for memory, what /ready
    said of Redis, how many it had delivered, and how many were pending.

    At intake's first refusal it sets `maxmemory` OVER_BYTES below what Redis uses, so the
    data itself is over the limit, as in the issue (its intake script, without a shebang,
    wrote on past the limit once started; ours is refused whole, and the refusal may come
    from a call's own request buffers)."""

    service: Service
    client: redis.Redis
    samples: list[tuple[float, bool, str, float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    limit: int = 0  # the maxmemory set at the first refusal

    def run(self) -> None:
        keys = Keys(self.service.settings.namespace)
        while not self.stop.wait(0.02):
            pending = self.client.zcard(keys.due) + self.client.zcard(keys.in_flight)
            delivered = self.service.metrics.value("blackbox_delivered_total")
            state = self.service.health.states["redis"]
            waiting = self.service.room.intake_waiting
            self.samples.append((time.monotonic(), waiting, state, delivered, pending))
            if waiting and not self.limit:
                self.limit = int(self.client.info("memory")["used_memory"]) - OVER_BYTES
                self.client.config_set("maxmemory", self.limit)

    def figures(self) -> Figures:
        waiting = [s for s in self.samples if s[1]]
        assert waiting, "intake never waited for memory: Redis did not fill"
        first, last = waiting[0], waiting[-1]
        delivered_while_waiting = sum(
            later[3] - earlier[3]
            for earlier, later in zip(self.samples, self.samples[1:], strict=False)
            if earlier[1]
        )
        drained = next(s for s in self.samples if s[0] > last[0] and s[4] == 0)  # waited for
        return Figures(
            pending_at_pause=first[4],
            delivered_at_pause=int(first[3]),
            delivered_while_full=int(delivered_while_waiting),
            seconds_full=round(last[0] - first[0], 2),
            seconds_from_pause_to_drained=round(drained[0] - first[0], 2),
            ready_said_full=any(s[2] == "full" for s in self.samples),
        )


def _scheduled(events: list[Received]) -> set[int]:
    """The intake offsets of the `scheduled` answers among `events`."""
    documents = (orjson.loads(e.value or b"") for e in events)
    return {d["intake"]["offset"] for d in documents if d["outcome"] == "scheduled"}


def test_a_full_redis_drains_itself_and_intake_resumes(
    start_service: ServiceFactory, reader: ReaderFactory, small_redis: RedisServer
) -> None:
    """Issue: firing stalled on a full Redis (the claim and the ack were refused for
    memory) and /ready said nothing. Now: more messages than Redis holds, each due 3 s
    after it was sent; intake waits while full, every message is delivered, duplicates
    only where a lease ran out (blackbox-attempt > 1), intake resumes by itself, and every
    request gets its `scheduled` answer (none lost to a poll refused part way)."""
    service = start_service(BLACKBOX_HEALTH_INTERVAL="0.2")
    target = unique("orders")
    bootstrap = service.settings.kafka["bootstrap.servers"]
    produce(bootstrap, service.settings.intake_topic, [envelope(target, "warm-up", 0)])
    delivered = reader(target)
    delivered.wait_count(1, timeout=30)  # intake has its partition: it reads at once
    client = redis.Redis.from_url(small_redis.url)
    watch = Watch(service, client)
    watcher = threading.Thread(target=watch.run, daemon=True)
    watcher.start()
    started = time.monotonic()
    produce(bootstrap, service.settings.intake_topic,
            (envelope(target, n, COUNTDOWN_S) for n in range(MESSAGES)))  # fmt: skip

    got = delivered.wait_for(
        lambda records: len({r.value for r in records}) > MESSAGES, timeout=DEADLINE_S
    )[1:]
    seconds = time.monotonic() - started
    wait_until(lambda: bool(watch.samples) and watch.samples[-1][4] == 0, timeout=10,
               what="nothing pending")  # fmt: skip
    watch.stop.set()
    watcher.join()
    client.close()

    figures = watch.figures()
    shown = {"messages": MESSAGES, "maxmemory": MAXMEMORY, "lowered_to": watch.limit,
             "copies_beyond_one":
             len(got) - len({r.value for r in got}), "seconds_all_delivered": round(seconds, 2),
             **asdict(figures)}  # fmt: skip
    print(orjson.dumps(shown).decode())  # noqa: T201 - the figures the docs quote
    first_attempts = Counter(r.value for r in got if r.header("blackbox-attempt") == "1")
    assert {orjson.loads(v or b"") for v in first_attempts} == set(range(MESSAGES))
    assert max(first_attempts.values()) == 1  # any other copy is a retry after a lease
    assert figures.pending_at_pause < MESSAGES
    assert figures.delivered_while_full > 0
    assert figures.ready_said_full
    assert not service.room.intake_waiting
    answered = reader(service.settings.events_topic).wait_for(
        lambda records: len(_scheduled(records)) > MESSAGES, timeout=15
    )
    assert len(_scheduled(answered)) == MESSAGES + 1  # each answered once, the warm-up too
    assert service.metrics.value("blackbox_redis_maxmemory_bytes") == watch.limit

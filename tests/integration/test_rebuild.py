"""`blackbox rebuild`: a Redis that lost everything is written back from Kafka. Every pending
schedule is delivered once, nothing delivered before arrives again, a series goes on at
its count, a paused one stays paused (intake/rebuild.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import redis

from blackbox.service import Service
from tests.integration.conftest import ReaderFactory, ServiceFactory, wipe_namespace
from tests.kafkatools import Received, produce, unique, wait_until
from tests.process import BlackboxProcess

CALLER = [("CALLER_SERVICE", b"billing")]
LATER = 40  # seconds: due after the flush and the rebuild
PLAIN = 20_000  # plain schedules pending at the flush: the size


def _send(service: Service, *requests: dict[str, Any], caller: bool = True) -> None:
    values = [orjson.dumps(r) for r in requests]
    produce(service.settings.kafka["bootstrap.servers"], service.settings.intake_topic, values,
            headers=CALLER if caller else ())  # fmt: skip


def _every_kind(service: Service, target: str) -> None:
    """Plain and caller's schedules, updates, cancels, a reschedule and two series."""
    _send(service, *({"topic": target, "message": f"early-{n}", "countdown": 0} for n in range(5)),
          *({"topic": target, "message": f"late-{n}", "countdown": LATER} for n in range(PLAIN)),
          caller=False)  # fmt: skip
    soon = time.time() + 600
    _send(
        service,
        *({"id": f"o-{n}", "topic": target, "message": f"o-{n} v1", "countdown": LATER}
          for n in range(4)),
        *({"id": f"o-{n}", "topic": target, "message": f"o-{n} v2", "countdown": LATER}
          for n in range(2)),
        *({"id": f"c-{n}", "topic": target, "message": f"c-{n}", "countdown": LATER}
          for n in range(2)),
        {"id": "c-0", "cancel": True}, {"id": "c-1", "cancel": True},
        {"id": "r-0", "topic": target, "message": "r-0", "countdown": 600},
        {"id": "r-0", "reschedule": True, "countdown": LATER},
        {"id": "s-run", "topic": target, "message": "s-run", "every": 5, "limit": 4,
         "missed": "all"},
        {"id": "s-held", "topic": target, "message": "s-held", "every": 5, "start": soon - 595},
        {"id": "s-held", "pause": True},
    )  # fmt: skip


def _bodies(records: list[Received]) -> Counter[str]:
    return Counter((r.value or b"").decode() for r in records)


def _all_in(found: Counter[str], wanted: Iterable[str]) -> bool:
    return all(found[body] >= 1 for body in wanted)


def test_a_flushed_redis_is_rebuilt_from_kafka_with_nothing_lost_or_delivered_twice(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    redis_client: redis.Redis,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Guarantee 1 (a wiped Redis is never run on silently, and every pending schedule can
    be rebuilt from Kafka): after FLUSHALL the service stops intake; `blackbox rebuild`
    writes back what was pending; then every pending schedule is delivered once, nothing
    delivered before arrives again, updates and cancels hold, the series goes on to its
    limit, and the paused series stays silent until resumed."""
    first = start_service()
    target = unique("rebuilt")
    delivered = reader(target)
    _every_kind(first, target)
    delivered.wait_for(lambda records: sum(_bodies(records)[f"early-{n}"] for n in range(5)) == 5
                       and _bodies(records)["s-run"] >= 2, timeout=30)  # fmt: skip
    first.stop()
    before = _bodies(delivered.read_to_end())
    wipe_namespace(redis_client, first.settings.namespace)

    refusing = start_service()
    wait_until(lambda: refusing.metrics.value("blackbox_intake_stopped_partitions") == 1,
               what="intake stopped on the wiped Redis")  # fmt: skip
    refusing.stop()

    rebuilt = BlackboxProcess(env, tmp_path / "rebuild.log", "rebuild", "--yes")
    assert rebuilt.wait(120) == 0, rebuilt.output()

    after = start_service()
    expected = {**{f"late-{n}": 1 for n in range(PLAIN)}, "o-0 v2": 1, "o-1 v2": 1, "o-2 v1": 1,
                "o-3 v1": 1, "r-0": 1}  # fmt: skip
    delivered.wait_for(lambda records: _all_in(_bodies(records), expected)
                       and _bodies(records)["s-run"] >= 4, timeout=LATER + 40)  # fmt: skip
    assert after.metrics.value("blackbox_intake_stopped_partitions") == 0
    everything = _bodies(delivered.read_to_end())
    for body, count in expected.items():
        assert everything[body] == count, body
    for n in range(5):
        assert everything[f"early-{n}"] == before[f"early-{n}"] == 1
    assert everything["s-run"] == 4  # its limit: those before the flush, the rest after
    occurrences = Counter(r.header("blackbox-occurrence-ms") for r in delivered.records
                          if r.value == b"s-run")  # fmt: skip
    assert set(occurrences.values()) == {1}
    for gone in ("o-0 v1", "o-1 v1", "c-0", "c-1", "s-held"):
        assert everything[gone] == 0, gone

    _send(after, {"id": "s-held", "resume": True})
    delivered.wait_for(lambda records: _bodies(records)["s-held"] >= 1, timeout=30)


def test_rebuild_refuses_while_a_replica_runs_and_without_yes(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """A rebuild deletes the namespace's keys: it asks for --yes, and refuses while a
    replica of the namespace runs (exit code 2, the reason on stderr)."""
    unconfirmed = BlackboxProcess(env, tmp_path / "no.log", "rebuild")
    assert unconfirmed.wait(60) == 2
    assert "--yes" in unconfirmed.output()
    start_service()
    running = BlackboxProcess(env, tmp_path / "running.log", "rebuild", "--yes")
    assert running.wait(60) == 2
    assert "still run" in running.output()


def _snapshot(client: redis.Redis, namespace: str) -> list[tuple[bytes, int, bytes]]:
    """Every key of the namespace as DUMP gives it, with its time to live (ms, 0: none);
    the processes' heartbeats left out (in a snapshot hours old they have all expired)."""
    keys = [k for k in client.scan_iter(match="{" + namespace + "*", count=1000)
            if not k.endswith((b":procs", b":firers"))]  # fmt: skip
    return [(k, max(0, int(client.pttl(k))), client.dump(k)) for k in keys]  # type: ignore[misc]


def _restore(client: redis.Redis, namespace: str, snapshot: list[tuple[bytes, int, bytes]]) -> None:
    wipe_namespace(client, namespace)
    for key, ttl, dumped in snapshot:
        client.restore(key, ttl, dumped, replace=True)


def test_a_redis_restored_from_an_old_snapshot_is_rebuilt_without_firing_twice(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    redis_client: redis.Redis,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Guarantee 1: a snapshot taken before some schedules fired and before others were
    accepted is restored; after the rebuild the ones accepted since are delivered, and the
    ones that fired since (pending again in the snapshot) are not delivered a second time."""
    first = start_service()
    target = unique("restored")
    delivered = reader(target)
    _send(first, *({"topic": target, "message": f"fired-{n}", "countdown": 3} for n in range(5)),
          *({"topic": target, "message": f"kept-{n}", "countdown": LATER} for n in range(5)),
          caller=False)  # fmt: skip
    wait_until(lambda: sum(first.store.counts()) == 10, what="10 stored")
    snapshot = _snapshot(redis_client, first.settings.namespace)
    _send(first, *({"topic": target, "message": f"since-{n}", "countdown": LATER}
                   for n in range(5)), caller=False)  # fmt: skip
    delivered.wait_for(lambda records: len(records) >= 5)
    wait_until(lambda: sum(first.store.counts()) == 10, what="the later 5 stored")
    first.stop()
    _restore(redis_client, first.settings.namespace, snapshot)

    rebuilt = BlackboxProcess(env, tmp_path / "rebuild.log", "rebuild", "--yes")
    assert rebuilt.wait(120) == 0, rebuilt.output()
    start_service()
    wanted = [*(f"kept-{n}" for n in range(5)), *(f"since-{n}" for n in range(5))]
    delivered.wait_for(lambda records: _all_in(_bodies(records), wanted), LATER + 40)
    everything = _bodies(delivered.read_to_end())
    assert {b: everything[b] for b in wanted} == dict.fromkeys(wanted, 1)
    assert {f"fired-{n}": everything[f"fired-{n}"] for n in range(5)} == {
        f"fired-{n}": 1 for n in range(5)
    }

"""Recurring schedules through a restart and a replica's SIGKILL (guarantee 8): each missed
policy does exactly what it says with the occurrences that fell due while nothing fired,
every series keeps its rhythm afterwards, and a kill -9 loses no occurrence.

Occurrences are read back from the target topic by their `blackbox-occurrence-ms` header;
every series sends its own name as its message, so a record tells which series it belongs
to whatever its headers say."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

from benchmarks.stack import ServiceProcess
from blackbox.envelope import CALLER_HEADER
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import Received, now_ms, produce, unique, wait_until

CALLER = "ops"
PERIOD_MS = 1000
GRACE_MS = 1000
OUTAGE_MS = 10_000
# The restart lands this long after an instant that is an occurrence minus the grace, so
# the first claim's cutoff (claim time - grace) falls between two occurrences unless the
# service takes most of a period to start: then the one occurrence it may pass over is
# judged both ways.
RESTART_PHASE_MS = 30
# The shortest lease the settings accept with a 2 s delivery timeout (2 + 1 + 2 + 1 s):
# an occurrence claimed by the killed replica fires again this soon.
REPLICA_SETTINGS = {"BLACKBOX_LEASE_SECONDS": "6.5", "BLACKBOX_DELIVERY_TIMEOUT": "2"}
REPLICAS = 3
SERIES = 20


def _send(env: dict[str, str], documents: Sequence[dict[str, Any]]) -> None:
    produce(
        env["KAFKA_BOOTSTRAP_SERVERS"],
        env["BLACKBOX_INTAKE_TOPIC"],
        [orjson.dumps(d) for d in documents],
        [(CALLER_HEADER, CALLER.encode())],
    )


def _next_second(after_ms: float) -> int:
    """The first whole second (epoch ms) at least `after_ms`: a common anchor."""
    return math.ceil(after_ms / 1000) * 1000


def _series(name: str, topic: str, start_ms: int, **rule: object) -> dict[str, Any]:
    return {"id": name, "topic": topic, "message": name, "every": PERIOD_MS // 1000,
            "start": start_ms / 1000, **rule}  # fmt: skip


@dataclass
class Occurrences:
    """What one series delivered: the copies of each occurrence, in topic order."""

    name: str
    copies: Counter[int]

    @property
    def distinct(self) -> list[int]:
        return sorted(self.copies)

    def after(self, occurrence_ms: int) -> list[int]:
        return [o for o in self.distinct if o > occurrence_ms]

    def duplicates(self) -> dict[int, int]:
        return {o: n for o, n in self.copies.items() if n > 1}


def _by_series(records: Sequence[Received], names: Sequence[str]) -> dict[str, Occurrences]:
    """Each series' occurrences; every record must carry its series' id, and be due at its
    occurrence (no jitter), so a copy of an occurrence is the same delivery again."""
    found = {name: Occurrences(name, Counter()) for name in names}
    for record in records:
        name = (record.value or b"").decode()
        occurrence = int(record.header("blackbox-occurrence-ms"))
        assert record.header("blackbox-id") == f"@{CALLER}/{name}", record
        assert int(record.header("blackbox-due-ms")) == occurrence, record
        found[name].copies[occurrence] += 1
    return found


def _grid(first: int, last: int) -> list[int]:
    """Every occurrence from `first` to `last`, one period apart."""
    return list(range(first, last + 1, PERIOD_MS))


def _report_duplicates(series: dict[str, Occurrences]) -> int:
    """Print the occurrences delivered more than once (at least once allows them); how many
    extra copies."""
    extra = 0
    for s in series.values():
        for occurrence, copies in sorted(s.duplicates().items()):
            print(f"duplicate: {s.name} occurrence {occurrence} x{copies}")  # noqa: T201
            extra += copies - 1
    print(f"extra copies: {extra}")  # noqa: T201
    return extra


# --- missed policies across a restart ---


@dataclass(frozen=True)
class Outage:
    """What the test knows of one series' outage: the last occurrence the first run
    delivered, and bounds on the cutoff of the first claim after the restart (its time
    less the grace): not before the restart began, not after a record of it arrived."""

    last_before: int
    cutoff_low: int
    cutoff_high: int

    def missed(self) -> list[int]:
        """Overdue by more than the grace at the first claim, whenever it came."""
        return [o for o in range(self.last_before + PERIOD_MS, self.cutoff_low, PERIOD_MS)]

    def unsure(self) -> list[int]:
        """Missed or not, depending on when within its bounds the first claim came."""
        first = _next_second(self.cutoff_low)
        return list(range(first, self.cutoff_high, PERIOD_MS))


def _check_policy(policy: str, delivered: Occurrences, outage: Outage) -> None:
    """The missed policy's exact outcome (an unsure occurrence is allowed either way), then
    consecutive occurrences one period apart."""
    missed, unsure = outage.missed(), outage.unsure()
    after = delivered.after(outage.last_before)
    assert after == _grid(after[0], after[-1]), f"{policy}: a gap after the restart: {after}"
    came = [o for o in after if o in missed]
    if policy == "skip":  # none missed; from the first not missed on
        assert came == [], f"skip delivered missed occurrences {came}"
        assert after[0] in [*unsure, _next_second(outage.cutoff_high)], after[0]
    elif policy == "once":  # the latest missed (or an unsure one, judged missed), then on
        assert after[0] in [missed[-1], *unsure], after[0]
        assert came == ([missed[-1]] if after[0] == missed[-1] else []), came
    else:  # every one missed, from the first after the stop
        assert after[0] == outage.last_before + PERIOD_MS, after[0]
        assert came == missed


def test_missed_policies_across_a_ten_second_restart(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 8: three every-second series with `grace: 1`, stopped for 10 s and started
    again: `skip` delivers none of the occurrences that fell due more than the grace before
    the first claim after the restart, `once` only the latest of them, `all` every one;
    nothing due before the stop is lost, each goes on one second apart, and a copy is only
    ever the same occurrence again under the same id."""
    policies = ["skip", "once", "all"]
    service = start_service()
    target = reader(unique("restarts"))
    anchor = _next_second(now_ms() + 1500)
    _send(env, [_series(p, target.topic, anchor, grace=GRACE_MS // 1000, missed=p)
                for p in policies])  # fmt: skip
    target.wait_for(lambda r: all(len(s.copies) >= 3 for s in _by_series(r, policies).values()))

    service.stop()  # the first run may deliver one more occurrence while it stops
    stopped = now_ms()
    first_run = len(target.read_to_end())
    restart_at = _next_second(stopped + OUTAGE_MS) + RESTART_PHASE_MS
    wait_until(lambda: now_ms() >= restart_at, OUTAGE_MS / 1000 + 5, "the outage")
    restarted = int(now_ms())
    start_service()

    def caught_up(records: list[Received]) -> bool:
        found = _by_series(records[first_run:], policies)
        return all(len(found[p].after(restarted)) >= 3 for p in policies)

    target.wait_for(caught_up, timeout=30)
    seen = {p: min(r.received_ms for r in target.records[first_run:] if r.value == p.encode())
            for p in policies}  # fmt: skip
    records = target.read_to_end()
    before, delivered = _by_series(records[:first_run], policies), _by_series(records, policies)

    _report_duplicates(delivered)
    for policy in policies:
        last = before[policy].distinct[-1]
        assert before[policy].distinct == _grid(anchor, last), "lost before the stop"
        outage = Outage(last, restarted - GRACE_MS, seen[policy] - GRACE_MS)
        print(policy, outage, "missed", len(outage.missed()), "unsure", outage.unsure())  # noqa: T201
        assert len(outage.missed()) >= OUTAGE_MS // PERIOD_MS - 3, outage
        _check_policy(policy, delivered[policy], outage)


# --- a replica killed ---


@contextmanager
def _replicas(env: dict[str, str], log: Path) -> Iterator[list[ServiceProcess]]:
    """REPLICAS `blackbox run` processes on one Redis, once every one is ready; stopped
    (those still alive) at the end."""
    with ExitStack() as stack:
        replicas = [ServiceProcess(env, "all", log) for _ in range(REPLICAS)]
        for replica in replicas:
            stack.callback(replica.stop)
        wait_until(lambda: all(r.ready() for r in replicas), 60, "every replica ready")
        yield replicas


def _in_flight(client: redis.Redis, layout: Layout) -> set[str]:
    """Every shard's in-flight ids."""
    pipe = client.pipeline(transaction=False)
    for keys in layout.shards:
        pipe.zrange(keys.in_flight, 0, -1)
    return {i.decode() for found in pipe.execute() for i in found}


def _kill_mid_fire(replica: ServiceProcess, client: redis.Redis, layout: Layout) -> set[str]:
    """SIGKILL `replica` the moment occurrences are in flight (or after 3 s without); the
    ids in flight, sampled just before and after: a superset of what it held."""
    deadline = time.monotonic() + 3
    held = _in_flight(client, layout)
    while not held and time.monotonic() < deadline:  # a claim holds ids for a few ms
        held = _in_flight(client, layout)
    replica.process.kill()
    replica.process.wait()
    return held | _in_flight(client, layout)


def _all_past(series: dict[str, Occurrences], instant_ms: float) -> bool:
    return all(s.distinct and s.distinct[-1] > instant_ms for s in series.values())


def test_a_replica_killed_mid_fire_loses_no_occurrence(
    reader: ReaderFactory, env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Guarantees 3 and 8: twenty every-second series shared by three replicas, one killed
    with SIGKILL while they fire: every occurrence of every series from its first to its
    last is delivered, and an occurrence delivered twice is the same occurrence under the
    same id, of a series in flight at the kill."""
    replica_env = {**env, **REPLICA_SETTINGS}
    target = reader(unique("replicas"))
    clients.ensure_topics(Settings.from_env(replica_env).kafka, [target.topic])
    layout = Layout(env["BLACKBOX_NAMESPACE"], DEFAULT_SHARDS)
    names = [f"s{n:02}" for n in range(SERIES)]
    with _replicas(replica_env, tmp_path / "replicas.log") as replicas:
        anchor = _next_second(now_ms() + 1500)
        _send(env, [_series(n, target.topic, anchor) for n in names])
        target.wait_for(lambda r: all(len(s.copies) >= 3 for s in _by_series(r, names).values()))
        killed_at = now_ms()
        held = _kill_mid_fire(replicas[0], redis_client, layout)
        # Past the lease of whatever the killed replica held, and a few periods more.
        settled = killed_at + float(REPLICA_SETTINGS["BLACKBOX_LEASE_SECONDS"]) * 1000 + 3000
        target.wait_for(lambda r: _all_past(_by_series(r, names), settled), timeout=40)
    delivered = _by_series(target.read_to_end(), names)

    extra = _report_duplicates(delivered)
    print(f"in flight at the kill: {sorted(held)}; extra copies {extra}")  # noqa: T201
    for s in delivered.values():
        assert s.distinct == _grid(anchor, s.distinct[-1]), f"{s.name}: a gap"
        assert not s.duplicates() or f"@{CALLER}/{s.name}" in held, s

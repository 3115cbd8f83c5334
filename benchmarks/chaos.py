"""The fault suite: crashes and hostile input against `blackbox run` on the local stack.

    python -m benchmarks.chaos               # full size: 20 kills, 10,000 hostile records
    python -m benchmarks.chaos crash --kills 5 --messages 2000
    python -m benchmarks.chaos redis-away broker-away --outage 30
    python -m benchmarks.chaos broker-kill
    python -m benchmarks.chaos kill-replicas --kills 20   # three replicas, one killed at a time

Each scenario prints a JSON line and a table. The integration tests run shortened versions.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable

import orjson
import redis
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from benchmarks import hostile
from benchmarks.collect import CollectorProcess
from benchmarks.replicakills import kill_replicas
from benchmarks.scenarios import table
from benchmarks.stack import Stack, local_stack, start_service
from blackbox.dev.servers import free_port
from blackbox.envelope import normalize_headers
from blackbox.kafka import clients
from blackbox.storage.store import pending_counts

Result = dict[str, object]
CHAOS_SETTINGS = {
    # The shortest lease the settings accept with a 2 s delivery timeout: 2 + 1 s for the
    # reports + the 2 s sweep delay + 1 s.
    "BLACKBOX_LEASE_SECONDS": "6.5",
    "BLACKBOX_DELIVERY_TIMEOUT": "2",
    "BLACKBOX_POLL_INTERVAL": "0.2",
    "BLACKBOX_MAX_MESSAGE_BYTES": str(hostile.MAX_BYTES),
}


class Sender(threading.Thread):
    """Sends `count` envelopes at a steady pace, counting those the broker acknowledged."""

    def __init__(self, stack: Stack, target: str, count: int, seconds: float) -> None:
        super().__init__(daemon=True)
        self.stack, self.target, self.count, self.seconds = stack, target, count, seconds
        self.accepted = 0

    def _report(self, error: KafkaError | None, _message: object) -> None:
        if error is None:
            self.accepted += 1

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.stack.broker.bootstrap,
                "linger.ms": 5,
                "enable.idempotence": True,
            }
        )  # a retry writes nothing twice
        rng, start = random.Random(3), time.monotonic()
        for n in range(self.count):
            lag = start + n * self.seconds / self.count - time.monotonic()
            if lag > 0:  # poll() returns at the first delivery report: sleep for the pace
                time.sleep(lag)
            producer.poll(0)
            value = {"topic": self.target, "message": n, "countdown": rng.uniform(0, 3)}
            producer.produce(self.stack.settings.intake_topic, orjson.dumps(value),
                             on_delivery=self._report)  # fmt: skip
        producer.flush(30)


def crash(messages: int = 5000, kills: int = 20, seed: int = 11) -> Result:
    """kill -9 the service at random moments under steady load; restart it each time."""
    rng = random.Random(seed)
    with local_stack(**CHAOS_SETTINGS) as stack:
        target = f"crash-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        collector = CollectorProcess(stack.broker.bootstrap, target, messages, timeout=600)
        # Load lasts past the last kill: each restart waits out the killed member's session.
        sender = Sender(stack, target, messages, seconds=kills * 8)
        sender.start()
        phases = _Phases(stack)
        for _ in range(kills):
            process = start_service(stack)
            try:
                phases.await_assignment()  # a kill before it reads anything proves nothing
                time.sleep(rng.uniform(0.5, 2.0))  # the chaos schedule: a random moment to die
                phases.kill_at_work(process)
            finally:  # killed whatever happened: a failed wait leaves no service behind
                process.kill()
                process.wait()
        phases.close()
        sender.join()
        final = start_service(stack)
        got = collector.result(timeout=600)
        final.terminate()
        final.wait(15)
    duplicated = {k: c for k, c in got.copies.items() if len(c) > 1}
    return {
        "scenario": "crash", "shards": stack.layout.count, "kills": kills, "sent": messages,
        "accepted": sender.accepted, **got.tally(sender.accepted),
        "duplicates_per_kill": round(got.duplicated() / kills, 1),
        "duplicates_by_attempt": got.copies_by_attempt(), **phases.counts,
        # Copies of one id are one schedule: the same due time on every copy.
        "duplicates_consistent": all(len({d for _, d in c}) == 1 for c in duplicated.values()),
    }  # fmt: skip


class _Phases:
    """What the service was in the middle of at each kill: ids claimed and not yet acked
    (mid-fire), intake records not yet committed (mid-intake)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.redis = redis.Redis.from_url(stack.redis.url)
        self.layout = stack.layout
        self.offsets = Consumer({"bootstrap.servers": stack.broker.bootstrap,
                                 "group.id": stack.settings.group_id})  # fmt: skip
        self.counts = {"kills_mid_fire": 0, "kills_mid_intake": 0}
        self.admin = AdminClient({"bootstrap.servers": stack.broker.bootstrap})
        self.members_seen: set[str] = set()

    def await_assignment(self, timeout: float = 60) -> None:
        """Wait until a member of the group not seen before holds intake partitions, the
        group stable: the replica just started reads intake (a killed one's session ended)."""
        group = self.stack.settings.group_id
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            (described,) = self.admin.describe_consumer_groups([group]).values()
            try:
                found = described.result(timeout=10)
            except KafkaException:  # the coordinator is loading, or the group not made yet
                time.sleep(0.1)
                continue
            members = {m.member_id for m in found.members if m.assignment.topic_partitions}
            if found.state == ConsumerGroupState.STABLE and members - self.members_seen:
                self.members_seen |= members
                return
            time.sleep(0.1)
        raise TimeoutError(f"no new member of {group} was assigned intake in {timeout} s")

    def kill_at_work(self, process: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
        """Kill `process` the moment an id is in flight (or once `timeout` runs out), so the
        kill lands mid-fire when it can: an id is in flight for a few ms only. Then count
        what it died in the middle of: ids it claimed and had not acked, seen just before
        the kill, and intake records it had not committed, counted just after."""
        deadline = time.monotonic() + timeout
        while (in_flight := self._in_flight()) == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        process.kill()
        self.counts["kills_mid_fire"] += in_flight > 0
        self.counts["kills_mid_intake"] += self._uncommitted() > 0

    def _in_flight(self) -> int:
        return pending_counts(self.redis, self.layout)[1]

    def _uncommitted(self) -> int:
        topic = self.stack.settings.intake_topic
        partitions = self.offsets.list_topics(topic, timeout=5).topics[topic].partitions
        committed = self.offsets.committed([TopicPartition(topic, p) for p in partitions], 5)
        ends = [self.offsets.get_watermark_offsets(tp, timeout=5)[1] for tp in committed]
        return sum(end - max(tp.offset, 0) for tp, end in zip(committed, ends, strict=True))

    def close(self) -> None:
        self.offsets.close()
        self.redis.close()


def redis_restart(appendfsync: str, messages: int = 3000, outage_s: float = 3.0) -> Result:
    """Append-only Redis killed hard mid-run and started again on the same data."""
    result = _restart("redis", messages, outage_s, appendfsync)
    return {**result, "scenario": f"redis restart, appendfsync {appendfsync}"}


def broker_restart(messages: int = 3000, down_s: float = 3.0) -> Result:
    """The Kafka broker killed hard mid-run and started again on the same data: intake,
    firing and the dead-letter and events producers all lose their broker at once."""
    return {**_restart("broker", messages, down_s), "scenario": "broker killed and restarted"}


def _restart(which: str, messages: int, down_s: float, appendfsync: str | None = None) -> Result:
    """Kill `which` (SIGKILL) under steady load, start it again on its data after `down_s`."""
    with local_stack(appendfsync=appendfsync, **CHAOS_SETTINGS) as stack:
        target = f"restart-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        collector = CollectorProcess(stack.broker.bootstrap, target, messages, timeout=600)
        process = start_service(stack)
        sender = Sender(stack, target, messages, seconds=6 * down_s)
        sender.start()
        server = stack.redis if which == "redis" else stack.broker
        time.sleep(down_s)  # the chaos schedule: let load build up, then kill the server
        server.kill()
        killed = time.monotonic()
        time.sleep(down_s)  # the outage itself
        server.start()
        back_after = time.monotonic() - killed
        sender.join()
        got = collector.result(timeout=600)
        alive = process.poll() is None
        process.terminate()
        process.wait(15)
    duplicated = {k: c for k, c in got.copies.items() if len(c) > 1}
    return {
        "sent": messages, "accepted": sender.accepted, **got.tally(sender.accepted),
        "back_after_s": round(back_after, 1), "service_alive": alive,
        "duplicates_consistent": all(len({d for _, d in c}) == 1 for c in duplicated.values()),
    }  # fmt: skip


def outage(which: str, messages: int = 3000, outage_s: float = 30.0) -> Result:
    """Redis or the broker unreachable (SIGSTOP) for `outage_s` under steady load."""
    port = free_port()
    with local_stack(appendfsync="always", BLACKBOX_HTTP_PORT=str(port), **CHAOS_SETTINGS) as stack:
        target = f"outage-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        collector = CollectorProcess(stack.broker.bootstrap, target, messages, timeout=600)
        process = start_service(stack)
        _wait_ready(port, True, timeout=30)
        sender = Sender(stack, target, messages, seconds=outage_s * 2)
        sender.start()
        time.sleep(outage_s / 3)  # the chaos schedule: let load build up, then pull it away
        server = stack.redis if which == "redis" else stack.broker
        os.kill(server.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        paused = time.monotonic()
        not_ready_after = _wait_ready(port, False, timeout=outage_s)
        time.sleep(max(0.0, outage_s - (time.monotonic() - paused)))  # the outage itself
        os.kill(server.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
        ready_after = _wait_ready(port, True, timeout=120)
        sender.join()
        got = collector.result(timeout=600)
        alive = process.poll() is None
        process.terminate()
        process.wait(15)
    return {
        "scenario": f"{which} away {outage_s:.0f} s", "sent": messages,
        "accepted": sender.accepted, **got.tally(sender.accepted),
        "not_ready_after_s": not_ready_after, "ready_again_after_s": ready_after,
        "service_alive": alive,
    }  # fmt: skip


def _wait_ready(port: int, ready: bool, timeout: float) -> float | None:
    """Seconds until /ready answers `ready` (None if it never did within `timeout`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
                now_ready = answer.status == 200
        except urllib.error.HTTPError:
            now_ready = False
        except OSError:
            now_ready = None
        if now_ready is ready:
            return round(time.monotonic() - start, 2)
        time.sleep(0.1)
    return None


def hostile_input(bad: int = 10_000, good_every: int = 10) -> Result:
    """Generated bad records interleaved with good ones: all bad dead-lettered, all good fire."""
    with local_stack(**CHAOS_SETTINGS) as stack:
        target = f"good-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        expected = _produce_hostile(stack, target, bad, good_every)
        good = sum(1 for e in expected.values() if e == "good")
        collector = CollectorProcess(stack.broker.bootstrap, target, good, timeout=300)
        process = start_service(stack)
        letters = _read(stack, stack.settings.dlq_topic, bad, timeout=300)
        got = collector.result(timeout=300)
        alive = process.poll() is None
        process.terminate()
        process.wait(15)
    wrong = [o for o, reason in letters.items() if expected.get(o) not in (reason, "any")]
    return {
        "scenario": "hostile input", "bad": bad, "good": good, "dead_lettered": len(letters),
        "wrong_reason": len(wrong), "good_delivered": len(got.copies),
        "service_alive": alive, "reasons": _tally(letters),
    }  # fmt: skip


def _produce_hostile(stack: Stack, target: str, bad: int, good_every: int) -> dict[int, str]:
    """Produce the mix; return offset -> expected reason ("good", "any" or a reason)."""
    producer = Producer({"bootstrap.servers": stack.broker.bootstrap, "linger.ms": 5,
                         "message.max.bytes": 4 * hostile.MAX_BYTES})  # fmt: skip
    expected: dict[int, str] = {}
    offset = 0
    for n, (value, headers, reason) in enumerate(hostile.records(bad)):
        if n % good_every == 0:
            good = orjson.dumps({"topic": target, "message": n, "countdown": 0})
            producer.produce(stack.settings.intake_topic, good)
            expected[offset], offset = "good", offset + 1
        producer.produce(stack.settings.intake_topic, value, headers=headers)
        expected[offset], offset = (reason.value if reason else "any"), offset + 1
    producer.flush(60)
    return expected


def _read(stack: Stack, topic: str, count: int, timeout: float) -> dict[int, str]:
    """Dead letters by original intake offset -> reason, until `count` arrived."""
    consumer = Consumer({"bootstrap.servers": stack.broker.bootstrap, "group.id": uuid.uuid4().hex,
                         "fetch.wait.max.ms": 20, "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    letters: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while len(letters) < count and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=0.2):
            if m.error() is None:
                headers = dict(normalize_headers(m.headers()))
                offset = int(headers["blackbox-dlq-offset"] or b"-1")
                letters[offset] = (headers["blackbox-dlq-reason"] or b"").decode()
    consumer.close()
    return letters


def _tally(letters: dict[int, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in letters.values():
        counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items()))


SCENARIOS = ("crash", "redis-always", "redis-everysec", "redis-away", "broker-away",
             "broker-kill", "hostile", "kill-replicas")  # fmt: skip


_MUST_BE_ZERO = ("lost", "wrong_reason", "messages_under_two_ids", "scheduled_not_delivered",
                 "duplicates_not_in_flight_at_a_kill")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--outage", type=float, default=30.0, help="seconds each outage lasts")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--bad", type=int, default=10_000)
    args = parser.parse_args()
    if set(args.names) - set(SCENARIOS):
        parser.error(f"choose scenarios from {', '.join(SCENARIOS)}")
    runs: dict[str, Callable[[], Result]] = {"crash": lambda: crash(args.messages, args.kills),
            "redis-always": lambda: redis_restart("always"),
            "redis-everysec": lambda: redis_restart("everysec"),
            "redis-away": lambda: outage("redis", outage_s=args.outage),
            "broker-away": lambda: outage("broker", outage_s=args.outage),
            "broker-kill": broker_restart,
            "hostile": lambda: hostile_input(args.bad),
            "kill-replicas": lambda: kill_replicas(args.messages, args.kills)}  # fmt: skip
    failed = False
    for name in args.names:
        result = runs[name]()
        print(orjson.dumps(result).decode(), flush=True)  # noqa: T201 - the figures
        print(table(result), flush=True)  # noqa: T201
        failed |= any(result.get(k, 0) != 0 for k in _MUST_BE_ZERO)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

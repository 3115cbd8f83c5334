"""A Kafka broker failing under a steady stream, on a 3-broker Apache Kafka cluster with
the topics as `blackbox create-topics` makes them there (3 copies, min.insync.replicas 2):
`blackbox run` (the defaults) and Redis on one machine with the cluster.

    python -m benchmarks.broker_failover [--rate 100] [--seconds 40] [--countdown 2]
                                         [--kill-at 10] [--down 15] [--stop kill|term]

Messages are sent at `rate` per second for `seconds`, each due `countdown` s after it was
sent. At `kill-at` s the broker-only node leading most partitions of the intake and
target topics is killed (SIGKILL; `--stop term`: SIGTERM, the controlled shutdown of a
rolling restart), and started again `down` s later. Printed: the topics'
replication as the cluster tells it (the events topic is made first with one copy, as a
cluster's default may make it: the service's start warns of it), what was sent, delivered,
lost and delivered twice, lateness at the consumer (read time minus due time) of the
messages due before the kill, while the broker was down, and after it came back, how long
`/ready` answered otherwise than 200, and the warnings the service logged.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from benchmarks.failover import Deliveries
from benchmarks.stack import ServiceProcess, wait_for
from blackbox.dev.brokers import KafkaCluster
from blackbox.dev.servers import RedisServer, free_port, scratch_dir
from blackbox.kafka import clients, replication
from blackbox.settings import Settings

PARTITIONS = 3


def _create_topics(env: dict[str, str], target: str) -> None:
    """The topics as a user creates them: `blackbox create-topics`, and the target topic
    with the same plan; but the events topic made first with one copy, as a cluster's
    default may make it (the service must warn of it at start)."""
    kafka = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    clients.ensure_topics(kafka, [Settings.from_env(env).events_topic], replication_factor=1)
    done = subprocess.run([sys.executable, "-m", "blackbox", "create-topics", "--partitions",
                           str(PARTITIONS)], env=env, capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"create-topics failed: {done.stderr.decode()}")
    plan = replication.plan(kafka)
    clients.ensure_topics(kafka, [target],
                          partitions=PARTITIONS, replication_factor=plan.replication_factor,
                          topic_config=plan.topic_config)  # fmt: skip


def _busiest_follower_node(bootstrap: str, topics: list[str]) -> int:
    """The broker-only node (not the controller, node 1) leading most partitions of
    `topics`."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    leaders = Counter(p.leader for t in topics for p in metadata.topics[t].partitions.values())
    return max((2, 3), key=lambda node: leaders[node])


def _wait_assigned(deliveries: Deliveries, settings: Settings, target: str) -> None:
    """Until the reader of the target topic has joined and reads it (a probe record sent
    there is read back): lateness then counts from a reader already at work."""
    probe = Producer(dict(settings.kafka))
    deadline = time.monotonic() + 60
    while deliveries.first("probe") is None and time.monotonic() < deadline:
        probe.produce(target, b"probe")
        probe.flush(10)
        time.sleep(0.5)


class ReadyWatch:
    """Polls the service's /ready every 0.2 s on a thread: the seconds it answered
    otherwise than 200."""

    def __init__(self, service: ServiceProcess) -> None:
        self.service, self.unready_s = service, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            if self.service.process.poll() is None and not self.service.ready():
                self.unready_s += 0.2

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _lateness(samples: list[float]) -> str:
    if not samples:
        return "none"
    ordered = sorted(samples)
    p50, p99 = (ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000 for q in (0.5, 0.99))
    return f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    (work / "redis").mkdir()
    redis = RedisServer(free_port(), work / "redis")
    with KafkaCluster(work / "kafka") as cluster:
        redis.start()
        env = {"REDIS_URL": redis.url, "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
               "BLACKBOX_LOG_FORMAT": "json"}  # fmt: skip
        settings, target = Settings.from_env(env), f"orders-{uuid.uuid4().hex[:8]}"
        _create_topics(env, target)
        copies = replication.found(settings.kafka, [settings.intake_topic, target])
        log = work / "service.log"
        service = ServiceProcess(env, "all", log)
        wait_for(service.ready, 90, "the service ready")
        deliveries, ready = Deliveries(settings, target), ReadyWatch(service)
        _wait_assigned(deliveries, settings, target)
        producer = Producer({**settings.kafka, "enable.idempotence": True, "linger.ms": 5})
        due: dict[str, float] = {}
        started, killed, back = time.time(), None, None
        victim = _busiest_follower_node(cluster.bootstrap, [settings.intake_topic, target])
        for n in range(int(args.rate * args.seconds)):
            time.sleep(max(0.0, started + n / args.rate - time.time()))
            if killed is None and time.time() - started >= args.kill_at:
                node = cluster.node(victim)
                threading.Thread(target=node.kill if args.stop == "kill" else node.stop).start()
                killed = time.time()
            if back is None and killed is not None and time.time() - killed >= args.down:
                cluster.node(victim).start()
                back = time.time()
            body = f"m-{n}"
            envelope = {"topic": target, "message": body, "countdown": args.countdown}
            producer.produce(settings.intake_topic, orjson.dumps(envelope),
                             headers=[("CALLER_SERVICE", b"bench")])  # fmt: skip
            due[body] = time.time() + args.countdown
            producer.poll(0)
        producer.flush(60)
        deadline = time.monotonic() + args.countdown + 120
        while time.monotonic() < deadline and any(deliveries.first(b) is None for b in due):
            time.sleep(0.5)
        alive = service.process.poll() is None
        ready.close()
        service.stop()
        deliveries.close()
        redis.stop()
    return _report(args, due, deliveries, copies, killed, back, ready.unready_s, alive, log)


def _report(  # noqa: PLR0913, PLR0917 - the run's readings, each named
    args: argparse.Namespace, due: dict[str, float], deliveries: Deliveries,
    copies: dict[str, replication.Found], killed: float | None, back: float | None,
    unready_s: float, alive: bool, log: Path,
) -> dict[str, object]:  # fmt: skip
    first = {b: deliveries.first(b) for b in due}
    late = {b: t - due[b] for b, t in first.items() if t is not None}
    down_from, down_to = killed or 0.0, back or 0.0
    phases = {
        "before the kill": [v for b, v in late.items() if due[b] < down_from],
        "while the broker was down": [v for b, v in late.items() if down_from <= due[b] < down_to],
        "after it came back": [v for b, v in late.items() if due[b] >= down_to],
    }
    warnings = Counter(
        line.get("event") for line in _json_lines(log) if line.get("level") in {"warning", "error"}
    )
    return {
        "replication (intake, target)": ", ".join(
            f"{c.replication_factor} copies, {c.min_insync_replicas} in sync"
            for c in copies.values()
        ),
        "sent": f"{len(due)} at {args.rate:g}/s, countdown {args.countdown:g} s",
        f"broker stopped ({args.stop}), s after start / down for, s": f"{args.kill_at:g} / "
        f"{args.down:g}",
        "delivered": len(late),
        "lost": sum(1 for t in first.values() if t is None),
        "duplicate copies": sum(len(deliveries.copies.get(b, [])[1:]) for b in due),
        **{f"lateness at the consumer, {name}": _lateness(v) for name, v in phases.items()},
        "/ready not 200, s": round(unready_s, 1),
        "service warnings and errors": dict(warnings) or "none",
        "service still running": alive,
    }


def _json_lines(log: Path) -> list[dict[str, object]]:
    found = []
    for line in log.read_bytes().splitlines():
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            found.append(parsed)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--countdown", type=float, default=2.0)
    parser.add_argument("--kill-at", type=float, default=10.0)
    parser.add_argument("--down", type=float, default=15.0)
    how = "kill: SIGKILL, a crash; term: SIGTERM, a rolling restart's controlled shutdown"
    parser.add_argument("--stop", choices=("kill", "term"), default="kill", help=how)
    args = parser.parse_args()
    result = run(args, scratch_dir("blackbox-bench-"))
    for name, value in result.items():
        print(f"{name:>52}: {value}", flush=True)  # noqa: T201 - the benchmark's output


if __name__ == "__main__":
    main()

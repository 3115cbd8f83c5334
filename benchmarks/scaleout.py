"""Scale-out benchmarks: `blackbox run` processes side by side on one Redis and on a
three-master Redis Cluster, against one Apache Kafka broker. Each run prints a JSON line;
the end prints the figures per setting, lowest-highest over the repeats.

    python -m benchmarks.scaleout                     # s3, s1 and burst on both kinds of Redis
    python -m benchmarks.scaleout s3 --processes 1 2 --redis single --repeat 3
    python -m benchmarks.scaleout burst --burst 1000000 --redis cluster
    python -m benchmarks.scaleout s3 idle --processes 2 --redis single --shards 1 16

s3: 100,000 records due in an hour sent to the intake topic (6 partitions) of 1-3
    `--role intake` processes: records/s stored.
s1: 20,000 messages sent through the intake of 1-3 `--role all` processes, due at one instant
    10 s ahead: time from that instant until the last is on the broker, fire rate, each
    process's share.
idle: 1-3 `--role all` processes with nothing pending for 30 s: what the ticks and sweeps
    cost by themselves (Redis calls/s, CPU of Redis and of the processes).
burst: 1,000,000 messages due at one instant (Sidekiq's failure case), written straight into
    the store (the intake is not what is measured), fired by 3 `--role dispatch` processes:
    time until the last is on the broker, fire rate, Redis's slowest calls (SLOWLOG). Then
    its floor on the same Redis and broker (benchmarks/floor.py's `burst_floor`): as many
    ids fired by the plain firing loop in as many OS processes, each its own share on keys of
    its own, all started at one instant; "floor" holds its time until every id is
    acknowledged and its CPU, "over_floor" blackbox's time over the floor's.

Times of delivery are the broker's own: the target topic stamps each record with its append
time (LogAppendTime), read back after the run, so no reader competes for the cores meanwhile.
CPU is counted per part (processes, Redis masters, broker) over the measured span; "cores
busy" is their sum over the span, which shows where a 2-core machine stops the curve.
The summary shows the floor's figures as "floor.<name>".
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson
from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks.floor import burst_floor
from benchmarks.producing import produce_waiting
from benchmarks.readings import Cpu, Slowlog, spread
from benchmarks.stack import (
    ServiceProcess,
    redis_for,
    service_processes,
    started_broker,
    wait_for,
)
from blackbox.clock import now_ms
from blackbox.dev.servers import KafkaBroker
from blackbox.firing.nudges import nudge_message
from blackbox.schedule import Schedule, intake_id
from blackbox.storage.applying import IntakeSlice
from blackbox.storage.connections import RedisClient, primaries, redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import RedisStore, pending_counts

Result = dict[str, object]

PARTITIONS = 6  # of the intake topic: up to 6 intake processes share it
SHARDS = DEFAULT_SHARDS  # what a user gets; --shards names others
S3_RECORDS = 100_000
S1_MESSAGES = 20_000
S1_AHEAD_S = 10.0
BURST_MESSAGES = 1_000_000
BURST_PROCESSES = 3
IDLE_S = 30.0
FILL_BATCH = 10_000
SLOW_CALL_US = 10_000  # the goal: no Redis call over 10 ms


@dataclass
class Run:
    """One benchmark run's parts: the broker, Redis, and the names one run owns alone."""

    broker: KafkaBroker
    redis_url: str
    shards: int
    kind: str  # of Redis: "single" or "cluster"
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.intake_topic = f"intake-{self.run}"
        self.target = f"target-{self.run}"
        self.floor_target = f"floor-{self.run}"  # what the burst's floor fires to
        self.layout = Layout(f"ns{self.run}", self.shards)
        self.env = {
            "REDIS_URL": self.redis_url,
            "KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap,
            "BLACKBOX_INTAKE_TOPIC": self.intake_topic,
            "BLACKBOX_DLQ_TOPIC": f"dlq-{self.run}",
            "BLACKBOX_EVENTS_TOPIC": f"events-{self.run}",
            "BLACKBOX_GROUP_ID": f"group-{self.run}",
            "BLACKBOX_NAMESPACE": self.layout.namespace,
            "BLACKBOX_SHARDS": str(self.shards),
            "BLACKBOX_LOG_FORMAT": "json",
            "BLACKBOX_LOG_LEVEL": "warning",
        }

    def create_topics(self) -> None:
        """The intake topic with PARTITIONS partitions and the target topic stamped with
        append times; the service creates its DLQ and events topics itself."""
        self._create([NewTopic(self.intake_topic, num_partitions=PARTITIONS),
                      target_topic(self.target)])  # fmt: skip

    def create_floor_target(self) -> None:
        """The floor's target topic, made as the service's target is."""
        self._create([target_topic(self.floor_target)])

    def _create(self, topics: list[NewTopic]) -> None:
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        for future in admin.create_topics(topics, request_timeout=15).values():
            future.result(15)

    def group_size(self) -> int:
        """How many members the intake group has once it is stable (0 until then)."""
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        group = self.env["BLACKBOX_GROUP_ID"]
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(10)
        if described.state != ConsumerGroupState.STABLE:
            return 0
        return len(described.members)


def target_topic(name: str) -> NewTopic:
    """A target topic: one partition, each record stamped with its append time."""
    return NewTopic(name, num_partitions=1, config={"message.timestamp.type": "LogAppendTime"})


def produce(bootstrap: str, topic: str, values: Sequence[bytes]) -> None:
    """Produce `values`, round-robin over the intake's partitions, as fast as the client can."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "queue.buffering.max.messages": 1_000_000})  # fmt: skip
    for n, value in enumerate(values):
        produce_waiting(producer, topic, value, partition=n % PARTITIONS)
    if producer.flush(60) != 0:
        raise SystemExit(f"could not produce every record to {topic}")


def requests(target: str, count: int, countdown: Callable[[], float]) -> list[bytes]:
    return [orjson.dumps({"topic": target, "message": n, "countdown": countdown()})
            for n in range(count)]  # fmt: skip


@dataclass(frozen=True)
class ReadBack:
    """What the target topic holds: records, distinct messages, first and last append time."""

    records: int
    messages: int
    first_ms: int
    last_ms: int


def read_back(bootstrap: str, topic: str, timeout: float = 120) -> ReadBack:
    """Read the whole (one-partition) target topic: what was delivered, and when."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})  # fmt: skip
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: set[bytes] = set()
    read, first, last = 0, 2**63, 0
    deadline = time.monotonic() + timeout
    while read < end and time.monotonic() < deadline:
        for m in consumer.consume(10_000, timeout=0.5):
            if m.error() is None:
                read += 1
                stamp = m.timestamp()[1]
                first, last = min(first, stamp), max(last, stamp)
                values.add(m.value() or b"")
    consumer.close()
    if read < end:
        raise SystemExit(f"read {read} of {end} records of {topic} within {timeout} s")
    return ReadBack(read, len(values), first, last)


def drain(run: Run) -> None:
    """Wait until nothing is due or in flight: everything is on the broker."""
    client = redis_client(run.redis_url)
    try:
        wait_for(lambda: pending_counts(client, run.layout) == (0, 0), 600, "the drain", 0.01)
    finally:
        client.close()


def tally(run: Run, processes: Sequence[ServiceProcess], count: int) -> tuple[ReadBack, Result]:
    """What arrived, read back after the drain: lost, duplicated, each process's share."""
    got = read_back(run.broker.bootstrap, run.target)
    return got, {
        "delivered": got.messages, "lost": count - got.messages,
        "duplicated": got.records - got.messages,
        "shares": [p.metric("blackbox_delivered_total") for p in processes],
    }  # fmt: skip


def s3_intake(run: Run, processes: int, count: int = S3_RECORDS) -> Result:
    """Records/s stored by `processes` intake processes, from the first stored to the last."""
    run.create_topics()
    values = requests(run.target, count, lambda: 3600)
    client = redis_client(run.redis_url)
    with service_processes(run.env, processes, "intake") as procs:
        wait_for(lambda: run.group_size() == processes, 60, "a stable intake group")
        produce(run.broker.bootstrap, run.intake_topic, values)
        wait_for(lambda: pending_counts(client, run.layout)[0] > 0, 60, "the first record", 0.001)
        cpu = Cpu(client, run.broker, procs)
        wait_for(lambda: pending_counts(client, run.layout)[0] >= count, 120,
                 "every record stored", 0.005)  # fmt: skip
        spent = cpu.stop()
    client.close()
    return {"records_per_s": round(count / spent.seconds), **spent.per(count, "record")}


def s1_burst(run: Run, processes: int, count: int = S1_MESSAGES) -> Result:
    """S1 through the intake of `processes` processes that also fire."""
    run.create_topics()
    client = redis_client(run.redis_url)
    with service_processes(run.env, processes, "all") as procs:
        wait_for(lambda: run.group_size() == processes, 60, "a stable intake group")
        due = now_ms() + int(S1_AHEAD_S * 1000)
        produce(run.broker.bootstrap, run.intake_topic,
                requests(run.target, count, lambda: (due - now_ms()) / 1000))  # fmt: skip
        wait_for(lambda: pending_counts(client, run.layout)[0] >= count
                 or now_ms() >= due, 60, "every message stored")  # fmt: skip
        wait_for(lambda: now_ms() >= due, S1_AHEAD_S, "the due instant", 0.001)
        cpu = Cpu(client, run.broker, procs)
        drain(run)
        spent = cpu.stop()
        got, counted = tally(run, procs, count)
    client.close()
    return {**burst_figures(got, due), **counted, **spent.per(count, "message")}


def burst(run: Run, processes: int, count: int = BURST_MESSAGES) -> Result:
    """`count` messages due at one instant, fired by `processes` dispatch processes; then
    the floor under it, once they are stopped: as many ids fired by the plain loop in as
    many processes."""
    run.create_topics()
    client = redis_client(run.redis_url)
    with service_processes(run.env, processes, "dispatch") as procs:
        store = RedisStore(client, run.layout, grace_seconds=86_400)
        seconds = fill_seconds(client, run.layout, count)
        due = now_ms() + int(seconds * 1000 * 1.3) + 5_000
        filled = time.monotonic()
        fill(store, run.target, count, due)
        fill_s = time.monotonic() - filled
        if now_ms() >= due:
            raise SystemExit(f"filling took {fill_s:.1f} s, past the due instant")
        slowlog = Slowlog(client, over_us=1_000)
        for shard in range(run.shards):  # as the intake would: wake whoever owns each shard
            client.publish(run.layout.wake_channel, nudge_message(shard, due))
        wait_for(lambda: now_ms() >= due, 600, "the due instant", 0.001)
        cpu = Cpu(client, run.broker, procs)
        drain(run)
        spent = cpu.stop()
        slow = slowlog.read(SLOW_CALL_US)
        got, counted = tally(run, procs, count)
    client.close()
    run.create_floor_target()
    floor = burst_floor(run.redis_url, run.broker.bootstrap, run.floor_target, count,
                        processes, str(count - 1).encode())  # fmt: skip
    over = (got.last_ms - due) / floor["last_after_start_ms"]  # blackbox's time, the floor's
    return {**burst_figures(got, due), **counted, "fill_s": round(fill_s, 1), **slow,
            **spent.per(count, "message"), "floor": floor,
            "over_floor": round(over, 2)}  # fmt: skip


def idle(run: Run, processes: int, seconds: int = int(IDLE_S)) -> Result:
    """`processes` processes that fire, with nothing pending: the standing cost of their
    ticks and sweeps over the namespace's shards."""
    run.create_topics()
    client = redis_client(run.redis_url)
    with service_processes(run.env, processes, "all") as procs:
        wait_for(lambda: run.group_size() == processes, 60, "a stable intake group")
        calls = redis_calls(client)
        cpu = Cpu(client, run.broker, procs)
        time.sleep(seconds)  # the span measured: nothing happens but the ticks
        spent = cpu.stop()
        calls = redis_calls(client) - calls
    client.close()
    per_s = spent.seconds / 1000  # CPU as ms per second
    return {"redis_calls_per_s": round(calls / spent.seconds),
            "redis_cpu_ms_per_s": round(spent.redis / per_s, 1),
            "service_cpu_ms_per_s": round(sum(spent.processes) / per_s, 1)}  # fmt: skip


def redis_calls(client: RedisClient) -> int:
    """Commands every Redis master has processed so far (a script counts its own calls)."""
    return sum(int(node.info("stats")["total_commands_processed"]) for node in primaries(client))


def burst_figures(got: ReadBack, due_ms: int) -> Result:
    span_s = (got.last_ms - got.first_ms) / 1000
    return {
        "last_after_due_ms": got.last_ms - due_ms,
        "first_after_due_ms": got.first_ms - due_ms,
        "fire_rate_per_s": round(got.records / span_s) if span_s > 0 else None,
    }


def fill_seconds(client: RedisClient, layout: Layout, count: int) -> float:
    """How long filling `count` messages will take, from one batch timed in a namespace no
    process reads (emptied with the rest after the run)."""
    probe = Layout(f"{layout.namespace}probe", layout.count)
    started = time.monotonic()
    fill(RedisStore(client, probe, grace_seconds=60), "probe", FILL_BATCH, now_ms() + 3_600_000)
    return count * (time.monotonic() - started) / FILL_BATCH


def fill(store: RedisStore, target: str, count: int, due_ms: int) -> None:
    """Write `count` messages due at `due_ms` straight into the store, in intake batches."""
    for start in range(0, count, FILL_BATCH):
        offsets = range(start, min(start + FILL_BATCH, count))
        items = [(o, Schedule(intake_id("fill", 0, o), target, str(o).encode(), due_ms))
                 for o in offsets]  # fmt: skip
        store.apply([IntakeSlice("fill", 0, offsets[-1], items)], now_ms())


SCENARIOS: dict[str, Callable[[Run, int, int], Result]] = {
    "s3": s3_intake, "s1": s1_burst, "burst": burst, "idle": idle,
}  # fmt: skip
COUNTS = {"s3": S3_RECORDS, "s1": S1_MESSAGES, "burst": BURST_MESSAGES, "idle": int(IDLE_S)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"any of {', '.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        help="process counts for s3 and s1 (default: 1 2 3)",
    )
    parser.add_argument("--burst-processes", type=int, default=BURST_PROCESSES)
    parser.add_argument("--burst", type=int, default=BURST_MESSAGES, help="messages of the burst")
    parser.add_argument(
        "--redis", nargs="+", choices=["single", "cluster"], default=["single", "cluster"]
    )
    parser.add_argument(
        "--shards", type=int, nargs="+", default=[SHARDS],
        help=f"shard counts, alternated within each repeat (default: {SHARDS})",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="runs of each setting")
    args = parser.parse_args()  # fmt: skip
    unknown = set(args.names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    results: list[Result] = []
    with started_broker() as broker:
        for kind in args.redis:
            with redis_for(kind) as url:
                for name in args.names or SCENARIOS:
                    for _ in range(args.repeat):
                        results += runs(name, broker, url, kind, args)
    flat = [flattened(result) for result in results]
    print(spread(flat, key=("scenario", "redis", "shards", "processes")), flush=True)  # noqa: T201
    return 0


def runs(
    name: str, broker: KafkaBroker, url: str, kind: str, args: argparse.Namespace
) -> list[Result]:
    """One run of each process count and shard count, the shard counts alternated (the
    machine drifts between runs: alternation spreads the drift over both)."""
    results = []
    for processes in [args.burst_processes] if name == "burst" else args.processes:
        for shards in args.shards:
            run = Run(broker, url, shards, kind)
            count = args.burst if name == "burst" else COUNTS[name]
            results.append(one_run(name, run, processes, count))
            print(orjson.dumps(results[-1]).decode(), flush=True)  # noqa: T201 - a benchmark prints figures
    return results


def one_run(name: str, run: Run, processes: int, count: int) -> Result:
    figures = SCENARIOS[name](run, processes, count)
    flush_all(run.redis_url)
    return {"scenario": name, "redis": run.kind, "shards": run.shards, "processes": processes,
            **figures}  # fmt: skip


def flattened(result: Result) -> Result:
    """`result` with each nested figure (the burst's "floor") beside the others, as
    "floor.<name>", so the summary shows its spread too."""
    flat: Result = {}
    for name, value in result.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{inner}": figure for inner, figure in value.items()})
        else:
            flat[name] = value
    return flat


def flush_all(url: str) -> None:
    """Empty Redis between runs (every master), so one run's memory does not weigh on the next."""
    client = redis_client(url)
    try:
        for node in primaries(client):
            node.flushall()
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())

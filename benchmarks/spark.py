"""The Spark jobs at scale, on a local stack (Redis, Apache Kafka, `blackbox run`).

    python -m benchmarks.spark schedule --rows 1000000
    python -m benchmarks.spark audit --rows 1000000
    python -m benchmarks.spark scenario --rows 100000

* schedule: N rows of Parquet (the example dataset, 1 % bad, due in an hour) through
  `blackbox spark schedule`; prints the job's wall time, its peak memory (the job's whole
  process tree: driver, JVM, Python workers) and the time until the service stored them all.
  Then the same job again, twice, once reading the whole events topic (which also holds
  `--old-events` events written before the first run, as retention keeps them) and once
  bounded by `--since` the first run: both send nothing.
* audit: N delivered records plus their `scheduled` events, written to Kafka by Spark in the
  shapes the dispatcher and the events topic use, then `blackbox spark audit` over them;
  prints the job's wall time and peak memory.
* scenario: the issue's test at full size: N rows due within seconds, all delivered, a
  re-run, the audit.
Each job runs as its own `blackbox` process, Spark on local[2].
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from blackbox.dev.servers import KafkaBroker, RedisServer, free_port, scratch_dir
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import pending_counts

CALLER = "bench"
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Stack:
    env: dict[str, str]
    settings: Settings
    work: Path


@contextmanager
def local_stack() -> Iterator[Stack]:
    work = scratch_dir("blackbox-spark-bench-")
    (work / "kafka").mkdir()
    store, broker = (
        RedisServer(free_port(), work),
        KafkaBroker(free_port(), work / "kafka", heap="1g"),
    )
    store.start()
    broker.start()
    env = {"REDIS_URL": store.url, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           "BLACKBOX_LOG_FORMAT": "json", "BLACKBOX_LOG_LEVEL": "warning",
           "BLACKBOX_HTTP_PORT": "0"}  # fmt: skip
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, settings.own_topics)
    try:
        yield Stack(env, settings, work)
    finally:
        broker.stop()
        store.stop()


@contextmanager
def service(stack: Stack) -> Iterator[None]:
    with (stack.work / "service.log").open("ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "blackbox", "run"],
                                   env={**os.environ, **stack.env}, stdout=log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield
    finally:
        process.terminate()
        process.wait(30)


def tree_rss(root: int) -> int:
    """Resident bytes of a process and all its descendants, now."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * PAGE
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def timed_job(stack: Stack, args: list[str]) -> tuple[float, int, int]:
    """Run `blackbox ARGS`; (wall seconds, peak tree RSS bytes, exit code)."""
    started = time.monotonic()
    with (stack.work / "jobs.log").open("ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "blackbox", *args],
                                   env={**os.environ, **stack.env}, stdout=log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss(process.pid))
        time.sleep(0.25)
    return time.monotonic() - started, peak, process.returncode


def write_dataset(stack: Stack, rows: int, min_delay_s: float) -> tuple[Path, int]:
    from blackbox.spark import example, session  # noqa: PLC0415 - the extra

    spark = session.start("local[2]", "blackbox-bench-data")
    path = stack.work / "rows.parquet"
    frame = example.dataset(spark, rows, prefix="bench", min_delay_s=min_delay_s)
    frame.write.mode("overwrite").parquet(str(path))
    spark.stop()
    return path, rows - sum(example.expected_rejects(rows).values())


def schedule_args(path: Path, out: Path) -> list[str]:
    return ["spark", "schedule", str(path), "--caller", CALLER, "--id", "user_id",
            "--topic-column", "topic", "--message", "payload", "--due", "delay_s",
            "--due-as", "delay", "--master", "local[2]", "--rejects", str(out / "rejects"),
            "--summary", str(out / "summary.json")]  # fmt: skip


def bench_schedule(rows: int, old_events: int) -> None:
    with local_stack() as stack, service(stack):
        path, good = write_dataset(stack, rows, min_delay_s=3600)
        _write_old_events(stack, old_events)
        since = time.time()
        layout = Layout(stack.settings.namespace, DEFAULT_SHARDS)  # a new namespace's
        store = redis.Redis.from_url(stack.env["REDIS_URL"])
        stored_at: list[float] = []
        started = time.monotonic()
        watching = (store, layout, good, stored_at)
        watcher = threading.Thread(target=_watch, args=watching, daemon=True)
        watcher.start()
        seconds, peak, code = timed_job(stack, schedule_args(path, stack.work / "run"))
        watcher.join(600)
        summary = json.loads((stack.work / "run" / "summary.json").read_text())
        _print({"job": "schedule", "rows": rows, "sent": summary["sent"],
                "rejected": summary["rejected_total"], "exit": code,
                "job_seconds": round(seconds, 1), "peak_rss_mb": peak // 2**20,
                "all_stored_seconds": round(stored_at[0] - started, 1) if stored_at else None,
                "stored": pending_counts(store, layout)[0]})  # fmt: skip
        for name, extra in (("rerun", []), ("rerun_since", ["--since", str(since)])):
            out = stack.work / name
            seconds, peak, code = timed_job(stack, [*schedule_args(path, out), *extra])
            again = json.loads((out / "summary.json").read_text())
            _print({"job": name, "rows": rows, "old_events": old_events, "sent": again["sent"],
                    "already_scheduled": again["already_scheduled"], "exit": code,
                    "job_seconds": round(seconds, 1), "peak_rss_mb": peak // 2**20})  # fmt: skip


def _write_old_events(stack: Stack, count: int) -> None:
    """`count` `scheduled` events of another caller, as an events topic keeps them."""
    from pyspark.sql import functions as F  # noqa: PLC0415 - the extra

    from blackbox.spark import session, topics  # noqa: PLC0415

    spark = session.start("local[2]", "blackbox-bench-data")
    event = F.struct(F.lit("scheduled").alias("outcome"), F.lit("earlier").alias("caller"),
                     F.format_string("@earlier/%d", "id").alias("blackbox_id"))  # fmt: skip
    events = spark.range(count).select(F.to_json(event).alias("value"))
    topics.write(events, topics.options(stack.settings.kafka), stack.settings.events_topic)
    spark.stop()


def _watch(store: redis.Redis, layout: Layout, count: int, done: list[float]) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if pending_counts(store, layout)[0] >= count:
            done.append(time.monotonic())
            return
        time.sleep(0.2)


def bench_audit(rows: int) -> None:
    with local_stack() as stack:
        since_ms = int(time.time() * 1000) - 1000
        _write_deliveries(stack, rows)
        out = stack.work / "audit"
        args = ["spark", "audit", "--out", str(out), "--since", str(since_ms / 1000),
                "--margin", "0", "--master", "local[2]"]  # fmt: skip
        seconds, peak, code = timed_job(stack, args)
        counts = json.loads((out / "summary.json").read_text())["counts"]
        _print({"job": "audit", "deliveries": counts["deliveries"], "events": rows,
                "lost": counts["lost"], "duplicated": counts["duplicated"], "exit": code,
                "job_seconds": round(seconds, 1), "peak_rss_mb": peak // 2**20})  # fmt: skip


def _write_deliveries(stack: Stack, rows: int) -> None:
    """`rows` scheduled events and one delivery each, shaped as blackbox writes them."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    from blackbox.spark import session, topics  # noqa: PLC0415

    spark = session.start("local[2]", "blackbox-bench-data")
    now = int(time.time() * 1000)
    base = spark.range(rows).select(
        F.format_string("@%s/user-%08d", F.lit(CALLER), "id").alias("blackbox_id"),
        F.lit(CALLER).alias("caller"),
        F.col("id").alias("n"),
        F.format_string("user-%08d", "id").alias("user"),
        F.when(F.col("id") % 2 == 0, "bench.erase").otherwise("bench.notify").alias("topic"),
        (F.lit(now) - F.lit(1000) + F.col("id") % 1000).alias("due_ms"),
        F.format_string("%s:0:%d", F.lit(stack.settings.intake_topic), "id").alias("version"),
    )
    options = topics.options(stack.settings.kafka)
    clients.ensure_topics(stack.settings.kafka, ["bench.erase", "bench.notify"])
    events = base.select(F.col("user").cast("binary").alias("key"), F.to_json(F.struct(
        F.lit("scheduled").alias("outcome"), F.lit(CALLER).alias("caller"),
        F.col("user").alias("id"), "blackbox_id", "due_ms", "topic",
        F.struct(F.lit(stack.settings.intake_topic).alias("topic"), F.lit(0).alias("partition"),
                 F.col("n").alias("offset")).alias("intake"),
        F.lit(now).alias("at_ms"))).alias("value"))  # fmt: skip
    topics.write(events, options, stack.settings.events_topic)
    named = {"blackbox-id": "blackbox_id", "blackbox-due-ms": "due_ms",
             "blackbox-version": "version", "CALLER_SERVICE": "caller"}  # fmt: skip
    headers = F.array(*[F.struct(F.lit(k).alias("key"), F.col(v).cast("string").cast("binary")
                                 .alias("value")) for k, v in named.items()])  # fmt: skip
    deliveries = base.select("topic", F.lit(b"{}").alias("value"), headers.alias("headers"))
    deliveries.write.format("kafka").options(**options).save()
    spark.stop()


def bench_scenario(rows: int) -> None:
    with local_stack() as stack, service(stack):
        path, good = write_dataset(stack, rows, min_delay_s=1)
        since = time.time() - 1
        seconds, _, code = timed_job(stack, schedule_args(path, stack.work / "first"))
        summary = json.loads((stack.work / "first" / "summary.json").read_text())
        print(f"schedule: {seconds:.1f} s, exit {code}, {summary}")  # noqa: T201
        again, _, _ = timed_job(stack, schedule_args(path, stack.work / "again"))
        rerun = json.loads((stack.work / "again" / "summary.json").read_text())
        print(f"re-run: {again:.1f} s, sent {rerun['sent']}")  # noqa: T201
        out = stack.work / "audit"
        args = ["spark", "audit", "--out", str(out), "--since", str(since), "--margin", "0"]
        seconds, _, code = timed_job(stack, [*args, "--master", "local[2]"])
        found = json.loads((out / "summary.json").read_text())
        _print(
            {
                "job": "scenario",
                "rows": rows,
                "good": good,
                "audit_seconds": round(seconds, 1),
                "exit": code,
                **found["counts"],
                "lateness_ms": found["lateness_ms"],
            }
        )


def _print(figures: dict[str, object]) -> None:
    print(json.dumps(figures))  # noqa: T201 - the benchmark's output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", choices=("schedule", "audit", "scenario"))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--old-events", type=int, default=1_000_000,
                        help="schedule: events in the topic before the first run")  # fmt: skip
    args = parser.parse_args()
    if args.job == "schedule":
        bench_schedule(args.rows, args.old_events)
    else:
        {"audit": bench_audit, "scenario": bench_scenario}[args.job](args.rows)


if __name__ == "__main__":
    main()

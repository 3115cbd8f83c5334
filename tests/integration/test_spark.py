"""The data pipeline on Spark: bulk scheduling and the delivery audit, end to end.

One real Spark session (local[2], Spark's own Kafka connector) is shared by these tests;
the broker and the service are the real ones of the other integration tests.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pyspark.sql import SparkSession

from blackbox.cli import main as cli
from blackbox.client import Client
from blackbox.envelope import CALLER_HEADER
from blackbox.exits import EXIT_FINDINGS, EXIT_OK
from blackbox.kafka import clients
from blackbox.metrics import LATENESS_BUCKETS
from blackbox.schedule import scoped_id
from blackbox.service import Service
from blackbox.signing import Signer, private_pem, public_text
from blackbox.spark import example, session
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import Received, produce, unique, wait_until

# A Spark job starts Python workers and a JVM stage per step: minutes on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# The issue's scenario has 100,000 rows: scaled down to fit the CI budget on 2 cores; the
# benchmark runs it at 100,000 (`python -m benchmarks.spark scenario`) and at 1,000,000.
ROWS = 20_000
CALLER = "bulk"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    started = session.start("local[2]", "blackbox-tests")
    yield started
    started.stop()


@pytest.fixture
def job_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The commands read their settings from the environment, as the service does."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def schedule(data: Path, out: Path, *extra: str) -> dict[str, Any]:
    summary = out / "summary.json"
    code = cli.main(["spark", "schedule", str(data), "--caller", CALLER, "--id", "user_id",
                     "--topic-column", "topic", "--message", "payload", "--due", "delay_s",
                     "--due-as", "delay", "--jitter", "1", "--rejects", str(out / "rejects"),
                     "--summary", str(summary), *extra])  # fmt: skip
    assert code == EXIT_OK
    result: dict[str, Any] = json.loads(summary.read_text())
    return result


def audit(out: Path, since_ms: int, *extra: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["spark", "audit", "--out", str(out), "--since", str(since_ms / 1000),
                     "--margin", "0", *extra])  # fmt: skip
    return code, json.loads((out / "summary.json").read_text())


def service_bucket(service: Service, quantile: float) -> tuple[float, float]:
    """The bounds (seconds) of the bucket of the service's send-lateness histogram that
    holds `quantile`: the time each message was handed to the producer minus its due time,
    which is what a delivered record's timestamp says too."""
    bounds = [*LATENESS_BUCKETS, float("inf")]
    name = "blackbox_send_lateness_seconds_bucket"
    counts = [service.metrics.value(name, {"le": _le(b)}) for b in bounds]
    index = next(i for i, count in enumerate(counts) if count >= quantile * counts[-1])
    return (bounds[index - 1] if index else 0.0), bounds[index]


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else str(bound)


def test_bulk_schedule_is_delivered_once_and_the_audit_agrees_with_the_service(
    spark: SparkSession, job_env: dict[str, str], start_service: ServiceFactory, tmp_path: Path
) -> None:
    """No silent loss and at-least-once, in bulk (guarantees 1, 2, 6): ROWS rows with bad
    ones are judged by the service's rules (rejects counted exactly), every good row is
    delivered, a re-run (its events read bounded by --since) schedules nothing twice, and the
    audit finds 0 lost, 0 duplicated and lateness quantiles inside the service's own
    histogram bucket for them."""
    data = tmp_path / "users.parquet"
    example.dataset(spark, ROWS, prefix=job_env["BLACKBOX_NAMESPACE"]).write.parquet(str(data))
    service = start_service()
    started_ms = int(time.time() * 1000)
    expected = example.expected_rejects(ROWS)
    first = schedule(data, tmp_path / "first")
    good = ROWS - sum(expected.values())
    assert (first["rejected"], first["valid"], first["sent"]) == (expected, good, good)
    assert spark.read.json(str(tmp_path / "first" / "rejects")).count() == sum(expected.values())
    delivered = "blackbox_delivered_total"
    wait_until(lambda: service.metrics.value(delivered) >= good, 120, "all delivered")
    # The re-run reads the events topic from the first run's start only (--since).
    again = schedule(data, tmp_path / "again", "--since", str(started_ms / 1000))
    assert (again["sent"], again["already_scheduled"]) == (0, good)

    code, found = audit(tmp_path / "audit", started_ms)
    counts = found["counts"]
    assert code == EXIT_OK and not found["failed"]
    assert (counts["scheduled"], counts["delivered"], counts["deliveries"]) == (good,) * 3
    assert (counts["lost"], counts["duplicated"], counts["early"]) == (0, 0, 0)
    assert service.metrics.value(delivered) == good
    assert (tmp_path / "audit" / "report.html").stat().st_size > 0
    for chart in ("lateness.png", "by_target.png", "per_minute.png", "dead_letters.png"):
        assert (tmp_path / "audit" / chart).stat().st_size > 1000
    lateness = sorted(
        r["lateness_ms"]
        for r in spark.read.parquet(str(tmp_path / "audit" / "deliveries")).collect()
    )
    for quantile in (0.5, 0.9, 0.99):
        low, high = service_bucket(service, quantile)
        ours = lateness[math.ceil(quantile * len(lateness)) - 1]
        # A record's timestamp is whole milliseconds: one of slack on each side.
        assert low * 1000 - 1 <= ours <= high * 1000 + 1, (quantile, ours, low, high)


def test_audit_counts_lost_and_duplicated_exactly_and_fails(  # noqa: PLR0913, PLR0917 - fixtures
    spark: SparkSession,
    job_env: dict[str, str],
    start_service: ServiceFactory,
    redis_client: redis.Redis,
    reader: ReaderFactory,
    tmp_path: Path,
) -> None:
    """The audit proves its own worth: payloads removed from Redis behind the service's back
    are reported lost, copies produced by hand are reported duplicated, each count exact,
    and the command exits non-zero (a scheduled check fails)."""
    rows, lost_ids, copies = 2_000, 7, 5
    prefix = job_env["BLACKBOX_NAMESPACE"]
    data = tmp_path / "users.parquet"
    frame = example.dataset(spark, rows, bad_every=0, prefix=prefix, max_delay_s=2, min_delay_s=8)
    frame.write.parquet(str(data))
    service = start_service()
    started_ms = int(time.time() * 1000)
    layout, store = service.store.layout, redis_client
    schedule(data, tmp_path / "run", "--jitter", "0")
    stored = "blackbox_intake_records_total"
    wait_until(lambda: service.metrics.value(stored, {"outcome": "scheduled"}) >= rows, 30)
    victims = [scoped_id(CALLER.encode(), f"user-{n:08d}") for n in range(lost_ids)]
    removed = sum(int(store.zrem(layout.keys_of(v).due, v)) for v in victims)
    assert removed == lost_ids, "the victims fired before they could be removed"
    for victim in victims:
        store.delete(layout.keys_of(victim).payload(victim))

    erase, notify = reader(f"{prefix}.erase"), reader(f"{prefix}.notify")
    wait_until(lambda: _read(erase) + _read(notify) >= rows - lost_ids, 60, "deliveries")
    _produce_copies(job_env["KAFKA_BOOTSTRAP_SERVERS"], erase.records[:copies])

    code, found = audit(tmp_path / "audit", started_ms)
    counts = found["counts"]
    assert code == EXIT_FINDINGS and found["failed"]
    assert (counts["lost"], counts["duplicated"], counts["extra_copies"]) == (
        lost_ids, copies, copies)  # fmt: skip
    lost = spark.read.parquet(str(tmp_path / "audit" / "lost")).select("blackbox_id").collect()
    assert sorted(r["blackbox_id"] for r in lost) == sorted(victims)


def _read(reader: Any) -> int:
    reader.poll(0.1)
    return len(reader.records)


def _produce_copies(bootstrap: str, records: list[Received]) -> None:
    """Deliver some messages a second time, headers and all, as a crash could."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for r in records:
        producer.produce(r.topic, r.value, r.key, headers=list(r.headers.items()))
    assert producer.flush(30) == 0


def test_audit_counts_a_series_by_occurrence(
    spark: SparkSession,
    job_env: dict[str, str],
    start_service: ServiceFactory,
    reader: ReaderFactory,
    tmp_path: Path,
) -> None:
    """Guarantees 2 and 8 in the audit: a series is counted by (blackbox-id, occurrence).
    Its 3 occurrences delivered (one of them copied by hand) are 3 occurrences, 1 duplicated,
    not 3 duplicates of one id; the one-off schedules delivered beside it to the same topic
    have 0 duplicates; an occurrence announced `fired` that the topic does not hold is lost,
    and fails the check."""
    service = start_service()
    started_ms = int(time.time() * 1000)
    bootstrap, target = job_env["KAFKA_BOOTSTRAP_SERVERS"], unique("series")
    series = {"id": "tick", "topic": target, "message": "t", "every": 1, "limit": 3}
    once = [{"id": f"once-{n}", "topic": target, "message": n, "countdown": 1} for n in range(3)]
    envelopes = [orjson.dumps(e) for e in (series, *once)]
    produce(
        bootstrap, job_env["BLACKBOX_INTAKE_TOPIC"], envelopes, [(CALLER_HEADER, CALLER.encode())]
    )
    events = reader(job_env["BLACKBOX_EVENTS_TOPIC"])
    events.wait_for(lambda found: any(b'"completed"' in (r.value or b"") for r in found))
    settle(service)
    records = reader(target).read_to_end()
    occurrences = sorted(
        (r for r in records if "blackbox-occurrence-ms" in r.headers),
        key=lambda r: int(r.header("blackbox-occurrence-ms")),
    )
    assert (len(occurrences), len(records)) == (3, 6)
    _produce_copies(bootstrap, occurrences[1:2])
    never_ms = int(occurrences[-1].header("blackbox-occurrence-ms")) + 1000
    _announce_fired(job_env, f"@{CALLER}/tick", target, never_ms)

    code, found = audit(tmp_path / "audit", started_ms)
    counts, by_occurrence = found["counts"], found["series"]
    assert code == EXIT_FINDINGS and found["failed"]
    assert by_occurrence == {"series": 1, "occurrences": 3, "deliveries": 4, "duplicated": 1,
                             "fired": 4, "lost": 1, "extra_copies": 1}  # fmt: skip
    assert (counts["scheduled"], counts["delivered"], counts["deliveries"]) == (3, 3, 3)
    assert (counts["duplicated"], counts["lost"], counts["early"]) == (0, 0, 0)
    tables = tmp_path / "audit"
    copied = spark.read.parquet(str(tables / "series_duplicates")).collect()
    assert [(r["occurrence_ms"], r["copies"]) for r in copied] == [
        (int(occurrences[1].header("blackbox-occurrence-ms")), 2)]  # fmt: skip
    lost = spark.read.parquet(str(tables / "series_lost")).collect()
    assert [(r["blackbox_id"], r["occurrence_ms"]) for r in lost] == [(f"@{CALLER}/tick", never_ms)]
    assert "Series, by occurrence" in (tables / "report.html").read_text()


def _announce_fired(env: dict[str, str], blackbox_id: str, topic: str, occurrence_ms: int) -> None:
    """A `fired` event, as the dispatcher writes it, for an occurrence no topic holds."""
    event = {"outcome": "fired", "caller": CALLER, "id": blackbox_id.split("/", 1)[1],
             "blackbox_id": blackbox_id, "due_ms": occurrence_ms, "topic": topic,
             "reason": None, "detail": None, "intake": None, "at_ms": int(time.time() * 1000),
             "occurrence_ms": occurrence_ms}  # fmt: skip
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_EVENTS_TOPIC"], [orjson.dumps(event)],
            [(CALLER_HEADER, CALLER.encode())])  # fmt: skip


def test_spark_signs_and_keys_like_the_client_on_six_partitions(  # noqa: PLR0913, PLR0917 - fixtures
    spark: SparkSession,
    job_env: dict[str, str],
    start_service: ServiceFactory,
    reader: ReaderFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Guarantee 7: rows scheduled through Spark with --signing-key are accepted by a caller
    that must sign, and each one's cancel sent by the Python client lands on the same one of
    6 intake partitions (both partition keys as Java does), so every cancel finds its
    schedule: nothing is delivered."""
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "bulk.pem"
    pem.write_bytes(private_pem(key))
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"callers:\n  {CALLER}:\n    require_signature: true\n"
                      f"    keys: {{bulk-1: \"{public_text(key.public_key())}\"}}\n")  # fmt: skip
    intake = unique("intake6")
    clients.ensure_topics({"bootstrap.servers": job_env["KAFKA_BOOTSTRAP_SERVERS"]}, [intake],
                        partitions=6)  # fmt: skip
    monkeypatch.setenv("BLACKBOX_INTAKE_TOPIC", intake)
    monkeypatch.setenv("BLACKBOX_POLICY_FILE", str(policy))
    service = start_service(BLACKBOX_INTAKE_TOPIC=intake, BLACKBOX_POLICY_FILE=str(policy))
    target, ids = unique("never"), [f"order-{n:05d}" for n in range(60)]
    rows = tmp_path / "rows.csv"
    with rows.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["user_id", "payload"])
        writer.writerows([i, f'{{"n": "{i}"}}'] for i in ids)
    code = cli.main(["spark", "schedule", str(rows), "--caller", CALLER, "--id", "user_id",
                     "--topic", target, "--message", "payload", "--countdown", "3600",
                     "--signing-key", str(pem), "--key-id", "bulk-1"])  # fmt: skip
    assert code == EXIT_OK
    stored = "blackbox_intake_records_total"
    wait_until(lambda: service.metrics.value(stored, {"outcome": "scheduled"}) >= len(ids), 60)
    bootstrap = job_env["KAFKA_BOOTSTRAP_SERVERS"]
    with Client({"bootstrap.servers": bootstrap}, caller=CALLER, intake_topic=intake,
                signer=Signer(key, "bulk-1")) as client:  # fmt: skip
        for schedule_id in ids:
            client.cancel(schedule_id)
    wait_until(lambda: service.metrics.value(stored, {"outcome": "cancelled"}) >= len(ids), 60)

    records = reader(intake).wait_count(2 * len(ids))
    partitions: dict[bytes | None, set[int]] = {}
    for record in records:
        partitions.setdefault(record.key, set()).add(record.partition)
    assert {k: len(p) for k, p in partitions.items()} == {i.encode(): 1 for i in ids}
    assert len({p for ps in partitions.values() for p in ps}) > 1  # spread over partitions
    assert service.store.counts() == (0, 0)
    assert reader(job_env["BLACKBOX_DLQ_TOPIC"]).read_to_end() == []


def test_spark_carries_each_rows_traceparent_to_its_delivery(
    spark: SparkSession,
    job_env: dict[str, str],
    start_service: ServiceFactory,
    reader: ReaderFactory,
    tmp_path: Path,
) -> None:
    """Guarantee 9, for the trace: a row's `--traceparent` column arrives on its delivered
    record byte for byte; a row with an empty one is delivered without a traceparent."""
    start_service()
    target = unique("traced")
    parents = {f"t-{n}": f"00-{n:032x}-{n + 7:016x}-01" for n in range(1, 4)}
    rows = tmp_path / "rows.csv"
    with rows.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["user_id", "payload", "tp"])
        writer.writerows([i, "x", tp] for i, tp in [*parents.items(), ("t-none", "")])
    code = cli.main(["spark", "schedule", str(rows), "--caller", CALLER, "--id", "user_id",
                     "--topic", target, "--message", "payload", "--countdown", "0",
                     "--traceparent", "tp"])  # fmt: skip
    assert code == EXIT_OK
    records = {r.header("blackbox-id"): r for r in reader(target).wait_count(4, timeout=60)}
    for schedule_id, parent in parents.items():
        assert records[scoped_id(CALLER.encode(), schedule_id)].header("traceparent") == parent
    assert "traceparent" not in records[scoped_id(CALLER.encode(), "t-none")].headers

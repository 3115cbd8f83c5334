"""The outbox on a real broker, with a producer that reports failures only."""

from __future__ import annotations

from blackbox.kafka import clients
from blackbox.kafka.outbox import Outbox, Record
from blackbox.settings import Settings
from tests.integration.conftest import ReaderFactory
from tests.kafkatools import unique


def _quiet_outbox(bootstrap: str) -> Outbox:
    settings = Settings.from_env({
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA_PRODUCER_ALLOW_AUTO_CREATE_TOPICS": "false",
        "KAFKA_PRODUCER_TOPIC_METADATA_PROPAGATION_MAX_MS": "500",
    })  # fmt: skip
    producer = clients.new_producer(settings, report_only_errors=True)
    return Outbox(producer, wait_seconds=15, only_errors=True)


def test_only_errors_outbox_reports_landed_records_and_names_the_failed_one(
    broker_bootstrap: str, reader: ReaderFactory
) -> None:
    """Guarantee 1: with no success reports, a batch counts as landed only once the producer
    is empty, and a record the broker refused still comes back with its error."""
    present, missing = unique("present"), unique("missing")
    clients.ensure_topics({"bootstrap.servers": broker_bootstrap}, [present])
    outbox = _quiet_outbox(broker_bootstrap)
    records = [Record(present, str(n).encode()) for n in range(200)]
    records.insert(100, Record(missing, b"nowhere"))

    errors = outbox.send(records)

    assert [i for i, e in enumerate(errors) if e is not None] == [100]
    assert clients.lasting_reason(errors[100]) is not None  # type: ignore[arg-type]
    landed = reader(present).wait_count(200)
    assert sorted(int(r.value or b"") for r in landed) == list(range(200))
    assert outbox.close() == 0


def test_only_errors_outbox_settles_batch_after_batch(broker_bootstrap: str) -> None:
    """Each batch is settled on its own: the second wait does not re-report the first."""
    topic = unique("batches")
    clients.ensure_topics({"bootstrap.servers": broker_bootstrap}, [topic])
    outbox = _quiet_outbox(broker_bootstrap)
    for batch in range(3):
        reports = outbox.submit([Record(topic, f"{batch}-{n}".encode()) for n in range(50)])
        assert outbox.wait(reports) == [None] * 50
        assert reports.pending == 0

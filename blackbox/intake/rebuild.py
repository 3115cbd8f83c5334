"""Rebuild: every schedule still pending written back to an empty or stale Redis from Kafka.

Kafka holds every request blackbox accepted; the target topics hold what it delivered. A
Redis that lost its data (flushed, restarted without persistence, restored from an old
snapshot) is rebuilt by reading each intake partition again from its start up to the
group's committed offset through the intake's own parsing and writing (`Replaying`: the
same envelope rules, policy and signature checks, the same ids, updates, cancels,
reschedules, pauses and resumes in the order they were sent), with three differences:

* nothing is answered or dead-lettered again (it was, when first read);
* a signature is checked for its key, not its age (the record was accepted then);
* a version already delivered is passed over, and a series is written at the first
  occurrence after the latest one delivered, its count the occurrences delivered
  (kafka/deliveries.py reads them back from each target topic, once, when the replay first
  meets it).

The namespace's keys are deleted first, so a restored snapshot's schedules that fired
since are not fired again; the watermarks end at the committed offsets, so the service
goes on from there. Every replica must be stopped: a running one would fire or write
meanwhile. What the API changed in Redis alone (a cancel or a move of a schedule without an
id of its own) is not in Kafka and comes back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from blackbox.clock import now_ms
from blackbox.envelope import Header
from blackbox.errors import BlackboxError
from blackbox.intake.batch import Batch
from blackbox.intake.crashguard import CrashGuard
from blackbox.intake.identity import Proof
from blackbox.intake.incarnations import Incarnations, RedisRecord
from blackbox.intake.loop import Intake, IntakeConfig, record_ms
from blackbox.intake.nonces import Nonces
from blackbox.intake.runner import answers_outbox, caller_policy_of, intake_config_of
from blackbox.kafka import clients, deliveries
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.deliveries import Delivered, Versions
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule, Series
from blackbox.settings import Settings
from blackbox.storage import shardcount, watermarks
from blackbox.storage.applying import Applied, IntakeSlice, Write
from blackbox.storage.connections import RedisClient, redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.intake.rebuild")

POLL_SECONDS = 1.0
_STORED = {Applied.SCHEDULED, Applied.UPDATED}


class ReplicasRunning(BlackboxError):
    """Processes of the namespace still run: a rebuild would race them."""


def rewritten(write: Write, delivered: Versions) -> Write | None:
    """What to write back of one accepted request: None for a version delivered already,
    a series moved past what was delivered of it, anything else as it is."""
    if not isinstance(write, Schedule):
        return write
    found = delivered.get((write.id, write.version))
    if found is None:
        return write
    if write.series is None:
        return None
    return _after_delivered(write, write.series, found)


def _after_delivered(schedule: Schedule, series: Series, found: Delivered) -> Schedule | None:
    """The series at its first occurrence after the latest delivered; None once ended."""
    latest = found.latest
    if latest is None:
        return schedule
    fired = series.fired + len([o for o in found.occurrences if o is not None])
    following = series.rule.after(latest)
    limit = series.rule.limit
    if following is None or (limit is not None and fired >= limit):
        return None
    moved = replace(series, occurrence_ms=following, fired=fired)
    schedule.series = moved
    schedule.due_ms = series.rule.due_of(schedule.id, following)
    return schedule


@dataclass(slots=True)
class Counts:
    """What a rebuild read and wrote."""

    records: int = 0
    written: int = 0
    passed_over: int = 0  # versions delivered before: not written back
    refused: int = 0  # refused when first read, refused again (nothing sent)
    targets: set[str] = field(default_factory=set)


class Replaying(Intake):
    """The intake's parsing and writing over records it accepted before (module docstring).

    It reuses `Intake` as it is and changes what a replay must not do again: answering,
    dead-lettering, and judging a signature's age by the clock of today."""

    def __init__(self, *args: Any, config_kafka: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_kafka = config_kafka
        self.delivered: Versions = {}
        self.counts = Counts()

    def _identified(
        self, message: Message, headers: list[Header], now: int
    ) -> tuple[Sequence[Header], Proof | None]:
        return super()._identified(message, headers, record_ms(message, now))

    def _rewritten(self, write: Write) -> Write | None:
        if isinstance(write, Schedule) and write.topic not in self.counts.targets:
            self.counts.targets.add(write.topic)
            self.delivered.update(deliveries.read(self.config_kafka, [write.topic]))
        kept = rewritten(write, self.delivered)
        if kept is None:
            self.counts.passed_over += 1
        return kept

    def _refuse(
        self, batch: Batch, message: Message, where: tuple[str, int, int], **_: Any
    ) -> None:
        self.counts.refused += 1

    def _send_dead_letters(self, dead: list[DeadLetter], stop: threading.Event) -> None:
        return

    def _answer(
        self, batch: Batch, codes: Sequence[Applied | None], now: int, stop: threading.Event,
        offsets: list[TopicPartition],
    ) -> None:  # fmt: skip
        self.counts.written += sum(1 for code in codes if code in _STORED)
        self._answering = None


def ranges(committed: dict[tuple[str, int], int | None]) -> dict[tuple[str, int], int]:
    """The partitions to replay, each up to (not including) its committed offset."""
    return {where: offset for where, offset in committed.items() if offset}


def refuse_if_running(client: RedisClient, layout: Layout, now_ms: int) -> None:
    """ReplicasRunning while any process of the namespace has a live heartbeat."""
    running = int(client.zcount(layout.processes, f"({now_ms}", "+inf"))
    if running:
        raise ReplicasRunning(
            f"{running} process(es) still run namespace {layout.namespace!r} (their heartbeats "
            "in Redis): stop every replica (scale to 0) before rebuilding."
        )


def wipe(client: RedisClient, layout: Layout) -> int:
    """Delete every key of the namespace's shards (the shard count and heartbeats stay)."""
    kept = {layout.shard_count, layout.processes, layout.members}
    deleted = 0
    for tag in {layout.tag, *(keys.tag for keys in layout.shards)}:
        for key in client.scan_iter(match=_pattern(tag), count=1000):
            if key.decode("utf-8", "replace") not in kept:
                deleted += int(client.delete(key))
    return deleted


def _pattern(tag: str) -> str:
    """A SCAN pattern matching the keys that start with `tag` (its glob characters escaped)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in tag) + "*"


def replay(intake: Replaying, consumer: Consumer, upto: dict[tuple[str, int], int]) -> None:
    """Read every partition of `upto` from its start to its offset through `intake`."""
    left = dict(upto)
    consumer.assign([TopicPartition(t, p, 0) for (t, p) in left])
    stop = threading.Event()
    while left:
        taken = [m for m in consumer.consume(500, timeout=POLL_SECONDS) if m.error() is None]
        records = [m for m in taken if (m.offset() or 0) < left.get(_where(m), -1)]
        if records:
            intake.handle(records, stop)
            intake.counts.records += len(records)
        for message in taken:
            if (message.offset() or 0) + 1 >= left.get(_where(message), 0):
                left.pop(_where(message), None)


def finish_marks(client: RedisClient, layout: Layout, fields: dict[str, int]) -> None:
    """Every shard's mark of each field at its committed offset minus one: the service goes
    on from the committed offsets, and its check finds no gap."""
    for field_name, committed in fields.items():
        watermarks.raise_to(client, layout, field_name, committed - 1)


def _where(message: Message) -> tuple[str, int]:
    return message.topic() or "", message.partition() or 0


def rebuild(settings: Settings) -> Counts:
    """Rebuild the namespace of `settings` from Kafka (module docstring); what it did."""
    client = redis_client(settings.redis_url)
    count = settings.shards or shardcount.adopt(client, settings.namespace)
    layout = Layout(settings.namespace, count)
    refuse_if_running(client, layout, now_ms())
    policy = caller_policy_of(settings)
    config = intake_config_of(settings, policy)
    committed = clients.committed_offsets(settings)(_partitions(settings, config.topics))
    upto = ranges(committed)
    deleted = wipe(client, layout)
    shardcount.Guard(client, layout, "rebuild", 1).settle(now_ms(), lambda _p: committed)
    log.info("rebuild_started", namespace=layout.namespace, keys_deleted=deleted,
             partitions=len(upto), records=sum(upto.values()))  # fmt: skip
    store = RedisStore(client, layout, settings.grace_seconds, settings.fired_retention)
    consumer = Consumer({**clients.consumer_config(settings), "group.id": "blackbox-rebuild",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        intake = _replaying(settings, store, consumer, config)
        replay(intake, consumer, upto)
        finish_marks(client, layout, _fields(intake, upto))
    finally:
        consumer.close()
    return intake.counts


def _replaying(
    settings: Settings, store: RedisStore, consumer: Consumer, config: IntakeConfig
) -> Replaying:
    """The replaying intake, wired as the service wires its intake (runner.py)."""
    return Replaying(
        consumer, store, answers_outbox(settings), config, Metrics(),
        incarnations=Incarnations(clients.topic_id_lookup(settings.kafka),
                                  RedisRecord(store.client, store.layout)),
        guard=CrashGuard(store.client, store.layout.intake_handling),
        nonces=Nonces(store.client, store.layout), config_kafka=dict(settings.kafka),
    )  # fmt: skip


def _partitions(settings: Settings, topics: Sequence[str]) -> list[tuple[str, int]]:
    """Every partition of the intake topics that exist."""
    metadata = AdminClient(dict(settings.kafka)).list_topics(timeout=10).topics
    return [(t, p) for t in topics if t in metadata for p in metadata[t].partitions]


def _fields(intake: Replaying, upto: dict[tuple[str, int], int]) -> dict[str, int]:
    """Each replayed partition's watermark field (its topic's incarnation named) and offset."""
    tags = intake.incarnations.tags({topic for topic, _ in upto})
    return {
        IntakeSlice(topic, partition, 0, (), tags[topic]).field: offset
        for (topic, partition), offset in upto.items()
    }

"""Rebuild: every schedule still pending written back to an empty or stale Redis from Kafka.

Kafka holds every request blackbox accepted; the target topics hold what it delivered. A
Redis that lost its data (flushed, restarted without persistence, restored from an old
snapshot) is rebuilt by reading each intake partition again from its start up to the
group's committed offset through the intake's own parsing and writing (`Replaying`: the
same envelope rules, policy and signature checks, the same ids, updates, cancels,
reschedules, pauses and resumes in the order they were sent), with these differences:

* nothing is answered or dead-lettered again (it was, when first read), and a record the
  dead-letter topic shows refused then is not taken now (kafka/letters.py);
* a signature is checked for its key, not its age (the record was accepted then);
* a schedule Kafka shows ended is not written back: delivered, dead-lettered, aged out of
  its target topic, or an `if_absent` retry of an id that ended (intake/passover.py); a
  series is written at the first occurrence after the latest one delivered, its count the
  occurrences delivered (kafka/deliveries.py reads each target topic once, when the replay
  first meets it). A caller's id passed over gets its ended marker back.

Before anything is deleted it refuses an intake partition whose first records aged out (a
series created there would be lost) unless told to accept that, reads the dead-letter
topic, and looks up every topic the intake records name (intake/targets.py): one it may not
read stops it while Redis is whole. Then it marks Redis "rebuild under way"
(intake/rebuilding.py: a service started meanwhile takes no intake and is not ready), deletes
the namespace's keys, so a restored snapshot's schedules that fired since are not fired
again, replays, and clears the mark last; the watermarks end at the committed offsets, so
the service goes on from there. Every replica must be stopped: a running one would fire or
write meanwhile. What the API changed in Redis alone (a cancel or a move of a schedule
without an id of its own) is not in Kafka and comes back.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from blackbox.clock import now_ms
from blackbox.envelope import Header, Request
from blackbox.errors import BlackboxError
from blackbox.intake import passover, rebuilding, targets
from blackbox.intake.batch import Batch
from blackbox.intake.crashguard import CrashGuard
from blackbox.intake.identity import Proof
from blackbox.intake.incarnations import Incarnations, RedisRecord
from blackbox.intake.loop import Intake, IntakeConfig, record_ms
from blackbox.intake.nonces import Nonces
from blackbox.intake.passover import Known, Reason
from blackbox.intake.runner import answers_outbox, caller_policy_of, intake_config_of
from blackbox.kafka import clients, deliveries, letters, readback
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.letters import Letters
from blackbox.kafka.readback import Extent
from blackbox.metrics import Metrics
from blackbox.schedule import SCOPED_PREFIX
from blackbox.settings import Settings
from blackbox.storage import shardcount, watermarks
from blackbox.storage.applying import Applied, IntakeSlice, Write
from blackbox.storage.connections import RedisClient, redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.intake.rebuild")

POLL_SECONDS = 1.0
_STORED = {Applied.SCHEDULED, Applied.UPDATED}
ACCEPT_FLAG = "--accept-aged-out"


class ReplicasRunning(BlackboxError):
    """Processes of the namespace still run: a rebuild would race them."""


class AgedOut(BlackboxError):
    """The intake topic no longer holds its first records: what they created is lost."""


@dataclass(slots=True)
class Counts:
    """What a rebuild read and wrote."""

    records: int = 0
    written: int = 0
    passed_over: Counter[str] = field(default_factory=Counter)  # reason -> not written back
    refused: int = 0  # refused when first read, refused again (nothing sent)
    refused_before: int = 0  # dead-lettered when first read: not taken
    skipped: int = 0  # delivered records or letters with headers out of bounds
    aged_out_records: int = 0  # intake records retention removed (accepted as lost)
    targets: set[str] = field(default_factory=set)

    @property
    def aged_out(self) -> int:
        return self.passed_over[Reason.AGED_OUT]

    @property
    def dead_lettered(self) -> int:
        return self.passed_over[Reason.DEAD_LETTERED]


class Replaying(Intake):
    """The intake's parsing and writing over records it accepted before (module docstring).

    It reuses `Intake` as it is and changes what a replay must not do again: answering,
    dead-lettering, judging a signature's age by the clock of today, and writing back what
    Kafka shows ended."""

    def __init__(
        self, *args: Any, config_kafka: dict[str, str], letters: Letters, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.config_kafka = config_kafka
        self.passing = Known(letters=letters)
        self.counts = Counts(skipped=letters.skipped)
        self._accepted_ms = 0  # the time of the record whose write is being judged

    def _identified(
        self, message: Message, headers: list[Header], now: int
    ) -> tuple[Sequence[Header], Proof | None]:
        return super()._identified(message, headers, record_ms(message, now))

    def _write(
        self, request: Request, message: Message, now: int, origin: str, proof: Proof | None
    ) -> Write:
        self._accepted_ms = record_ms(message, now)
        return super()._write(request, message, now, origin, proof)

    def _rewritten(self, write: Write) -> Write | None:
        topic = getattr(write, "topic", None)
        if isinstance(topic, str) and topic not in self.counts.targets:
            self.counts.targets.add(topic)
            found = deliveries.read(self.config_kafka, [topic])
            self.passing.deliveries.merge(found)
            self.counts.skipped += found.skipped
        kept, reason = passover.judged(write, self.passing, self._accepted_ms)
        if reason is not None:
            self.counts.passed_over[reason] += 1
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


def ranges(
    committed: Mapping[tuple[str, int], int | None], kept: Mapping[tuple[str, int], Extent]
) -> dict[tuple[str, int], tuple[int, int]]:
    """The partitions to replay: each from its oldest kept record up to (not including) its
    committed offset."""
    found = {}
    for where, offset in committed.items():
        low = kept[where].low if where in kept else 0
        if offset and offset > low:
            found[where] = (low, offset)
    return found


def refuse_aged_out(
    committed: Mapping[tuple[str, int], int | None], kept: Mapping[tuple[str, int], Extent],
    accept: bool,
) -> int:  # fmt: skip
    """AgedOut when an intake partition with commits lost its first records (unless
    `accept`); how many records it lost."""
    lost = {w: min(kept[w].low, c or 0) for w, c in committed.items() if w in kept and c}
    aged = sum(lost.values())
    if aged and not accept:
        named = ", ".join(f"{t}:{p}" for (t, p), n in sorted(lost.items()) if n)
        raise AgedOut(
            f"the intake topic no longer holds the first {aged} records of {named} (its "
            "retention removed them): a series created there would be lost. Nothing was "
            f"deleted. Run again with {ACCEPT_FLAG} to rebuild without them."
        )
    return aged


def refuse_if_running(client: RedisClient, layout: Layout, now_ms: int) -> None:
    """ReplicasRunning while any process of the namespace has a live heartbeat."""
    running = int(client.zcount(layout.processes, f"({now_ms}", "+inf"))
    if running:
        raise ReplicasRunning(
            f"{running} process(es) still run namespace {layout.namespace!r} (their heartbeats "
            "in Redis): stop every replica (scale to 0) before rebuilding."
        )


def wipe(client: RedisClient, layout: Layout) -> int:
    """Delete every key of the namespace's shards (the shard count, heartbeats and the
    rebuild's own mark stay)."""
    kept = {layout.shard_count, layout.processes, layout.members, rebuilding.key(layout)}
    deleted = 0
    for tag in {layout.tag, *(keys.tag for keys in layout.shards)}:
        for key in client.scan_iter(match=_pattern(tag), count=1000):
            if key.decode("utf-8", "replace") not in kept:
                deleted += int(client.delete(key))
    return deleted


def _pattern(tag: str) -> str:
    """A SCAN pattern matching the keys that start with `tag` (its glob characters escaped)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in tag) + "*"


def replay(
    intake: Replaying, consumer: Consumer, spans: Mapping[tuple[str, int], tuple[int, int]]
) -> None:
    """Read every partition of `spans` from its start to its end through `intake`, but
    the records the dead-letter topic shows refused when first read."""
    left = {where: end for where, (_, end) in spans.items()}
    consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in spans.items()])
    stop = threading.Event()
    while left:
        taken = [m for m in consumer.consume(500, timeout=POLL_SECONDS) if m.error() is None]
        records = [m for m in taken if (m.offset() or 0) < left.get(_where(m), -1)]
        kept = [m for m in records if _coordinates(m) not in intake.passing.letters.refused]
        intake.counts.refused_before += len(records) - len(kept)
        if kept:
            intake.handle(kept, stop)
        intake.counts.records += len(records)
        for message in taken:
            if (message.offset() or 0) + 1 >= left.get(_where(message), 0):
                left.pop(_where(message), None)


def finish_marks(client: RedisClient, layout: Layout, fields: dict[str, int]) -> None:
    """Every shard's mark of each field at its committed offset minus one: the service goes
    on from the committed offsets, and its check finds no gap."""
    for field_name, committed in fields.items():
        watermarks.raise_to(client, layout, field_name, committed - 1)


def mark_ended(client: RedisClient, layout: Layout, ids: Iterable[str], seconds: int) -> None:
    """The ended marker ("f") of each caller's id passed over as ended, as the service kept
    it: a later `if_absent` create or a cancel is answered as it was then."""
    pipe = client.pipeline(transaction=False)
    for schedule_id in ids:
        if schedule_id.startswith(SCOPED_PREFIX):
            pipe.set(layout.keys_of(schedule_id).ended(schedule_id), "f", ex=seconds)
    pipe.execute()


def _where(message: Message) -> tuple[str, int]:
    return message.topic() or "", message.partition() or 0


def _coordinates(message: Message) -> tuple[str, int, int]:
    return message.topic() or "", message.partition() or 0, message.offset() or 0


@dataclass(frozen=True, slots=True)
class Plan:
    """What Kafka holds to rebuild from, read before anything is deleted."""

    config: IntakeConfig
    committed: dict[tuple[str, int], int | None]
    spans: dict[tuple[str, int], tuple[int, int]]  # partition -> [start, end) to replay
    refused: Letters
    aged_out: int


def rebuild(settings: Settings, *, accept_aged_out: bool = False) -> Counts:
    """Rebuild the namespace of `settings` from Kafka (module docstring); what it did."""
    client = redis_client(settings.redis_url)
    count = settings.shards or shardcount.adopt(client, settings.namespace)
    layout = Layout(settings.namespace, count)
    refuse_if_running(client, layout, now_ms())
    plan = planned(settings, accept_aged_out)
    rebuilding.begin(client, layout)
    deleted = wipe(client, layout)
    shardcount.Guard(client, layout, "rebuild", 1).settle(now_ms(), lambda _p: plan.committed)
    log.info("rebuild_started", namespace=layout.namespace, keys_deleted=deleted,
             partitions=len(plan.spans), aged_out_records=plan.aged_out,
             records=sum(end - start for start, end in plan.spans.values()))  # fmt: skip
    store = RedisStore(client, layout, settings.grace_seconds, settings.fired_retention)
    try:
        intake = _replay_all(settings, store, plan)
    except readback.Unreadable as e:
        raise readback.Unreadable(f"{e}. The rebuild stopped half-way and its mark keeps the "
                                  "service's intake stopped: make the topic readable, then "
                                  "run the rebuild again") from e  # fmt: skip
    mark_ended(client, layout, intake.passing.ended, settings.fired_retention)
    finish_marks(client, layout, _fields(intake, plan.spans))
    rebuilding.end(client, layout)
    return intake.counts


def planned(settings: Settings, accept_aged_out: bool) -> Plan:
    """The intake partitions' spans and the dead letters; AgedOut, or readback.Unreadable
    for the dead-letter topic or a target topic, before anything is deleted."""
    config = intake_config_of(settings, caller_policy_of(settings))
    committed = clients.committed_offsets(settings)(_partitions(settings, config.topics))
    kept = readback.extents_of(settings.kafka, config.topics)
    aged = refuse_aged_out(committed, kept, accept_aged_out)
    refused = letters.read(settings.kafka, settings.dlq_topic)
    spans = ranges(committed, kept)
    targets.check_readable(settings.kafka, targets.named(settings.kafka, spans))
    return Plan(config, committed, spans, refused, aged)


def _replay_all(settings: Settings, store: RedisStore, plan: Plan) -> Replaying:
    """Replay the plan's spans through a replaying intake with a consumer of its own."""
    consumer = Consumer({**clients.consumer_config(settings), "group.id": "blackbox-rebuild",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        intake = _replaying(settings, store, consumer, plan.config, plan.refused)
        intake.counts.aged_out_records = plan.aged_out
        replay(intake, consumer, plan.spans)
    finally:
        consumer.close()
    return intake


def _replaying(
    settings: Settings, store: RedisStore, consumer: Consumer, config: IntakeConfig,
    refused: Letters,
) -> Replaying:  # fmt: skip
    """The replaying intake, wired as the service wires its intake (runner.py)."""
    return Replaying(
        consumer, store, answers_outbox(settings), config, Metrics(),
        incarnations=Incarnations(clients.topic_id_lookup(settings.kafka),
                                  RedisRecord(store.client, store.layout)),
        guard=CrashGuard(store.client, store.layout.intake_handling),
        nonces=Nonces(store.client, store.layout), config_kafka=dict(settings.kafka),
        letters=refused,
    )  # fmt: skip


def _partitions(settings: Settings, topics: Sequence[str]) -> list[tuple[str, int]]:
    """Every partition of the intake topics that exist."""
    metadata = AdminClient(dict(settings.kafka)).list_topics(timeout=10).topics
    return [(t, p) for t in topics if t in metadata for p in metadata[t].partitions]


def _fields(intake: Replaying, spans: Mapping[tuple[str, int], tuple[int, int]]) -> dict[str, int]:
    """Each replayed partition's watermark field (its topic's incarnation named) and offset."""
    tags = intake.incarnations.tags({topic for topic, _ in spans})
    return {
        IntakeSlice(topic, partition, 0, (), tags[topic]).field: end
        for (topic, partition), (_, end) in spans.items()
    }

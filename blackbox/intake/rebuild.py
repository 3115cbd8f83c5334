"""Rebuild: every schedule still pending written back to an empty or stale Redis from Kafka.

Kafka holds every request blackbox accepted; the target topics hold what it delivered. A
Redis that lost its data (flushed, restarted without persistence, restored from an old
snapshot) is rebuilt by reading each intake partition the group committed on again from
its start to its end through the intake's own parsing and writing (`Replaying`: the
same envelope rules, policy and signature checks, the same ids, updates, cancels,
reschedules, pauses and resumes in the order they were sent), with these differences:

* nothing is answered or dead-lettered again (it was, when first read, or the service does
  when it reads again what lies past the committed offset), and a record the dead-letter
  topic shows refused then is not taken now (kafka/letters.py);
* a record below the group's committed offset that the dead-letter topic does not show
  refused was accepted then: it is parsed and keyed to its caller as then, but not judged
  by today's policy and keys (a key rotated out, a caller moved to other topics since);
  one past it is judged as the service would, its signature's age counted to its record's
  time. A record refused now is counted and logged as a warning;
* a schedule Kafka shows ended is not written back: delivered, dead-lettered, aged out of
  its target topic (judged on its latest due time, after moves), or an `if_absent` retry of
  an id that ended (intake/passover.py); a series is written at the first occurrence after
  the latest one delivered, its count the occurrences delivered (kafka/deliveries.py reads
  each target topic once, when the replay first meets it). A caller's id passed over gets
  its ended marker back.

Before anything is deleted it refuses an intake partition whose first records aged out (a
series created there would be lost) unless told to accept that, reads the dead-letter
topic, and looks up every topic the intake records name (intake/targets.py): the schedules
of one it may not describe are passed over and counted (`target_unreadable`), since what
was delivered there cannot be told. Then it marks Redis "rebuild under way"
(storage/rebuilding.py: a service started meanwhile takes no intake, fires nothing and is
not ready), looks again for running replicas (one started while it planned), deletes
the namespace's keys, so a restored snapshot's schedules that fired since are not fired
again, replays, and clears the mark last; the watermarks end at each partition's last
record replayed, so the service, going on from the committed offsets, skips what it reads
again there (what a replica killed before its offsets' commit had handled, and fired).
Every replica must be stopped: a running one would fire or write meanwhile. What the API
changed in Redis alone (a cancel or a move of a schedule without an id of its own) is not
in Kafka and comes back.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from blackbox.clock import now_ms
from blackbox.envelope import Header, Request
from blackbox.errors import BlackboxError, CorruptSchedule, InvalidEnvelope
from blackbox.intake import passover, targets
from blackbox.intake.batch import Batch
from blackbox.intake.config import IntakeConfig
from blackbox.intake.crashguard import CrashGuard
from blackbox.intake.identity import Proof
from blackbox.intake.incarnations import Incarnations, RedisRecord
from blackbox.intake.loop import Intake
from blackbox.intake.nonces import Nonces
from blackbox.intake.passover import Known, Reason
from blackbox.intake.runner import answers_outbox, caller_policy_of, intake_config_of
from blackbox.intake.sorting import Sorting, record_ms
from blackbox.kafka import clients, deliveries, letters, readback, storetopic
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.letters import Letters
from blackbox.kafka.readback import Extent
from blackbox.metrics import Metrics
from blackbox.reference import Reference
from blackbox.schedule import SCOPED_PREFIX, Schedule
from blackbox.settings import Settings
from blackbox.signing import Parts
from blackbox.storage import clocks, rebuilding, shardcount, watermarks
from blackbox.storage.applying import Applied, IntakeSlice, Write
from blackbox.storage.connections import RedisClient, redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.intake.rebuild")

POLL_SECONDS = 1.0
# Store versions written back per round (each its script calls, see applying.py).
RESTORE_PART = 5000
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
    stored: int = 0  # versions read from the store topic
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
    dead-lettering, and, in its sorting (`Replayed`), judging a signature's age by the
    clock of today and writing back what Kafka shows ended."""

    sorting: Replayed

    def __init__(
        self, *args: Any, config_kafka: dict[str, str], letters: Letters,
        committed: Mapping[tuple[str, int], int | None],
        unreadable: frozenset[str] = frozenset(), **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.config_kafka = config_kafka
        self.committed = committed
        self.unreadable = unreadable
        self.passing = Known(letters=letters,
                             retention_ms=self.store.ended_retention_seconds * 1000)  # fmt: skip
        self.counts = Counts(skipped=letters.skipped)

    def _sorting(self) -> Replayed:
        return Replayed(self)

    def accepted_before(self, message: Message) -> bool:
        """Below the group's committed offset and not refused in the dead-letter topic (the
        replay left those out): the service accepted it, under the policy and keys of then."""
        return (message.offset() or 0) < (self.committed.get(_where(message)) or 0)

    def restored(self, schedule: Schedule, written_ms: int) -> Write | None:
        """What to write back of a version the store topic kept (written at `written_ms`):
        judged as a replayed request is, passed over where Kafka shows it ended."""
        return self.sorting.restored(schedule, written_ms)

    def _send_dead_letters(self, dead: list[DeadLetter], stop: threading.Event) -> None:
        return

    def _answer(
        self, batch: Batch, codes: Sequence[Applied | None], now: int, stop: threading.Event,
        offsets: list[TopicPartition],
    ) -> None:  # fmt: skip
        self.counts.written += sum(1 for code in codes if code in _STORED)


class Replayed(Sorting):
    """The sorting of a replay: a record accepted before is taken as it was then (its
    signature as recorded, its caller's policy not judged again), and what Kafka shows
    ended is passed over, counted in the replay's counts."""

    def __init__(self, replay: Replaying) -> None:
        """The parts of `replay` sorting needs (made while it is built: what is its own, it
        reads when called)."""
        super().__init__(replay.config, replay.metrics, replay.store, identity=replay.identity,
                         placement=replay.placement, quotas=replay.quotas,
                         nonces=replay.nonces, gaps=replay.gaps, known=replay.known)  # fmt: skip
        self.replay = replay
        self._accepted_ms = 0  # the time of the record whose write is being judged

    def identified(
        self, message: Message, headers: list[Header], now: int
    ) -> tuple[Sequence[Header], Proof | None]:
        stamp = record_ms(message, now)
        if not self.replay.accepted_before(message):
            return super().identified(message, headers, stamp)
        parts = Parts(message.topic() or "", message.key(), message.value(), headers)
        return self.identity.recorded(parts, now)

    def judged_by_policy(self, message: Message) -> bool:
        return not self.replay.accepted_before(message)

    def write(
        self, request: Request, message: Message, now: int, origin: str, proof: Proof | None
    ) -> Write:
        self._accepted_ms = record_ms(message, now)
        return super().write(request, message, now, origin, proof)

    def rewritten(self, write: Write) -> Write | None:
        replay, counts = self.replay, self.replay.counts
        topic = getattr(write, "topic", None)
        if topic in replay.unreadable:  # what was delivered there cannot be told
            counts.passed_over[Reason.TARGET_UNREADABLE] += 1
            return None
        if isinstance(topic, str) and topic not in counts.targets:
            counts.targets.add(topic)
            found = deliveries.read(replay.config_kafka, [topic])
            replay.passing.deliveries.merge(found)
            counts.skipped += found.skipped
        kept, reason = passover.judged(write, replay.passing, self._accepted_ms)
        if reason is not None:
            counts.passed_over[reason] += 1
        if reason is Reason.SERIES_UNCOUNTED:
            log.warning("rebuild_series_uncounted", id=getattr(write, "id", ""), topic=topic,
                        why="its target topic lost too many of its deliveries to bound its "
                        "count: not written back, so it cannot run past its limit")  # fmt: skip
        return kept

    def restored(self, schedule: Schedule, written_ms: int) -> Write | None:
        """What to write back of a version the store topic kept (written at `written_ms`)."""
        self._accepted_ms = written_ms
        return self.rewritten(schedule)

    def refuse(
        self, batch: Batch, message: Message, where: tuple[str, int, int], *,
        error: InvalidEnvelope, **_: Any,
    ) -> None:  # fmt: skip
        self.replay.counts.refused += 1
        log.warning("rebuild_refused", reason=error.reason.value, detail=error.detail,
                    topic=where[0], partition=where[1], offset=where[2],
                    accepted_before=self.replay.accepted_before(message))  # fmt: skip


def ranges_past_commits(
    committed: Mapping[tuple[str, int], int | None], kept: Mapping[tuple[str, int], Extent]
) -> dict[tuple[str, int], tuple[int, int]]:
    """With a store topic, which holds every version up to the committed offsets: the
    partitions the group committed on, each from its committed offset (or its oldest kept
    record, if retention went past it) to its end when the rebuild began; one with nothing
    past its commit is empty, its watermark still set at its end (`finish_marks`)."""
    found = {}
    for where, offset in committed.items():
        if not offset or where not in kept:
            continue
        found[where] = (min(max(offset, kept[where].low), kept[where].high), kept[where].high)
    return found


def refuse_aged_out_past_commits(
    committed: Mapping[tuple[str, int], int | None], kept: Mapping[tuple[str, int], Extent],
    accept: bool,
) -> int:  # fmt: skip
    """As `refuse_aged_out`, beside a store topic: only records past a committed offset
    are not in the store, so only those count as lost."""
    lost = {w: max(0, kept[w].low - (c or 0)) for w, c in committed.items() if w in kept and c}
    if sum(lost.values()) and not accept:
        named = ", ".join(f"{t}:{p}" for (t, p), n in sorted(lost.items()) if n)
        raise AgedOut(
            f"the intake topic no longer holds {sum(lost.values())} records of {named} past "
            "the group's committed offsets (its retention removed them before the service "
            f"read them): what they asked for is lost. Nothing was deleted. Run again with "
            f"{ACCEPT_FLAG} to rebuild without them."
        )
    return sum(lost.values())


class StoreNeverFilled(BlackboxError):
    """The store topic was never filled: it may lack schedules pending before it was set."""


def read_store(config: Mapping[str, Any], topic: str) -> storetopic.Contents:
    """The store topic's contents; StoreNeverFilled for one never filled (filling.py)."""
    contents = storetopic.read(config, topic)
    if not contents.filled:
        raise StoreNeverFilled(
            f"the store topic {topic!r} was never filled (`blackbox fill-store`): it may lack "
            "schedules pending before it was set. Nothing was deleted. Rebuild from the "
            "intake topic instead: run again with BLACKBOX_STORE_TOPIC unset."
        )
    return contents


def restore(
    intake: Replaying, store: RedisStore, contents: storetopic.Contents, topic: str,
    *, indexing: bool = False,
) -> None:  # fmt: skip
    """Write back each version the store topic keeps, judged by `intake` (passed over
    where Kafka shows it ended), before the intake records past the commits are replayed;
    `indexing` (index mode): a one-off version as a reference to its record."""
    kept = contents.kept
    intake.counts.stored = len(kept)
    for tombstone in contents.ended:  # their ended markers come back (`mark_ended`)
        intake.passing.end(tombstone.id, tombstone.written_ms, cancel=tombstone.cancelled)
    fields = set()
    for start in range(0, len(kept), RESTORE_PART):
        slices = _stored_slices(intake, topic, kept[start : start + RESTORE_PART], indexing)
        codes = store.apply(slices, now_ms())
        intake.counts.written += sum(1 for code in codes if code in _STORED)
        fields |= {part.field for part in slices}
    watermarks.forget(store.client, store.layout, fields)  # the store's are no intake's
    store.client.set(store.layout.store_filled, topic)  # Redis holds what the store does


def _stored_slices(
    intake: Replaying, topic: str, kept: Sequence[storetopic.Kept], indexing: bool
) -> list[IntakeSlice]:
    """The versions of `kept` to write back, as intake slices by store partition."""
    items: dict[int, list[tuple[int, Write]]] = {}
    last: dict[int, int] = {}
    for version in kept:
        last[version.partition] = version.offset
        try:
            schedule = Schedule.decode(version.id, version.value)
        except CorruptSchedule as e:
            intake.counts.skipped += 1
            log.warning("rebuild_store_record_unreadable", id=version.id, error=str(e),
                        partition=version.partition, offset=version.offset)  # fmt: skip
            continue
        write = intake.restored(schedule, version.written_ms)
        if indexing and isinstance(write, Schedule) and write.series is None:
            place = Reference(write.due_ms, version.partition, version.offset,
                              len(version.value), write.caller)  # fmt: skip
            write.stored = place.encode()
        if write is not None:
            items.setdefault(version.partition, []).append((version.offset, write))
    return [IntakeSlice(topic, p, end, items.get(p, ())) for p, end in last.items()]


def ranges(
    committed: Mapping[tuple[str, int], int | None], kept: Mapping[tuple[str, int], Extent]
) -> dict[tuple[str, int], tuple[int, int]]:
    """The partitions to replay, those the group committed on: each from its oldest kept
    record to its end when the rebuild began (records handled past the committed offset
    may have fired before the group committed them: the service must skip them as re-reads)."""
    found = {}
    for where, offset in committed.items():
        low, high = (kept[where].low, kept[where].high) if where in kept else (0, offset or 0)
        if offset and high > low:
            found[where] = (low, high)
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
    the records the dead-letter topic shows refused when first read (an empty span is
    not read)."""
    spans = {where: span for where, span in spans.items() if span[1] > span[0]}
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
        if not taken:
            _drop_passed(consumer, left)


def _drop_passed(consumer: Consumer, left: dict[tuple[str, int], int]) -> None:
    """The partitions whose position reached their end although no record said so (their
    last offsets hold transaction markers)."""
    for position in consumer.position([TopicPartition(t, p) for t, p in left]):
        where = (position.topic, position.partition)
        if 0 <= left[where] <= position.offset:
            left.pop(where, None)


def finish_marks(client: RedisClient, layout: Layout, fields: dict[str, int]) -> None:
    """Every shard's mark of each field at the last offset replayed: the service goes on
    from the committed offsets, reads what lies past them again as re-reads (skipped), and
    its check finds no gap."""
    for field_name, end in fields.items():
        watermarks.raise_to(client, layout, field_name, end - 1)


def age_out_latest(store: RedisStore, intake: Replaying) -> None:
    """The caller's ids first judged aged out, judged again on their latest due time (after
    the moves and updates replayed): those still due before their target topic's oldest
    kept record are passed over."""
    for schedule_id in sorted(intake.passing.aging):
        stored = store.load(schedule_id)
        if stored is not None and passover.aged_out(stored, intake.passing):
            store.cancel(schedule_id)
            intake.passing.end(schedule_id, stored.due_ms)
            intake.counts.passed_over[Reason.AGED_OUT] += 1


def mark_ended(client: RedisClient, layout: Layout, known: Known, now: int) -> None:
    """The ended marker of each caller's id that ended ("f" passed over as ended, "c"
    cancelled), as the service kept it: a later `if_absent` create or a cancel is answered
    as it was then, until the marker runs out when the service's would have (its retention
    counted from the end's record time); one that ran out already is gone."""
    pipe = client.pipeline(transaction=False)
    for schedule_id, ended_ms in known.ended.items():
        if not schedule_id.startswith(SCOPED_PREFIX):
            continue
        key = layout.keys_of(schedule_id).ended(schedule_id)
        left_ms = ended_ms + known.retention_ms - now
        if left_ms > 0:
            pipe.set(key, "c" if schedule_id in known.cancelled else "f", px=left_ms)
        else:
            pipe.delete(key)
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
    unreadable: frozenset[str] = frozenset()  # target topics blackbox may not describe
    stored: storetopic.Contents | None = None  # the store topic's, where one is set


def rebuild(settings: Settings, *, accept_aged_out: bool = False) -> Counts:
    """Rebuild the namespace of `settings` from Kafka (module docstring); what it did."""
    client = redis_client(settings.redis_url)
    count = settings.shards or shardcount.adopt(client, settings.namespace)
    layout = Layout(settings.namespace, count)
    refuse_if_running(client, layout, now_ms())
    plan = planned(settings, accept_aged_out)
    marked_before = rebuilding.under_way(client, layout)
    rebuilding.begin(client, layout)
    try:  # a replica started while it planned: it must not race the deletes
        refuse_if_running(client, layout, now_ms())
    except ReplicasRunning:
        if not marked_before:
            rebuilding.end(client, layout)
        raise
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
    age_out_latest(store, intake)
    mark_ended(client, layout, intake.passing, now_ms())
    finish_marks(client, layout, _fields(intake, plan.spans))
    clocks.restart(client, layout, now_ms())  # Redis whole again: any lost-data mark goes
    rebuilding.end(client, layout)
    return intake.counts


def planned(settings: Settings, accept_aged_out: bool) -> Plan:
    """The intake partitions' spans and the dead letters; AgedOut, or readback.Unreadable
    for the dead-letter topic or a target topic, before anything is deleted."""
    config = intake_config_of(settings, caller_policy_of(settings))
    committed = clients.committed_offsets(settings)(_partitions(settings, config.topics))
    kept = readback.extents_of(settings.kafka, config.topics)
    if settings.store_topic:  # the store holds what the records up to the commits asked for
        aged = refuse_aged_out_past_commits(committed, kept, accept_aged_out)
        spans = ranges_past_commits(committed, kept)
    else:
        aged = refuse_aged_out(committed, kept, accept_aged_out)
        spans = ranges(committed, kept)
    stored = read_store(settings.kafka, settings.store_topic) if settings.store_topic else None
    refused = letters.read(settings.kafka, settings.dlq_topic)
    unreadable = targets.unreadable(settings.kafka, targets.named(settings.kafka, spans))
    for topic, error in unreadable.items():
        log.warning("rebuild_target_unreadable", topic=topic, error=error,
                    action="its schedules are passed over (target_unreadable): grant "
                    "blackbox Describe and Read on it and rebuild again to keep them")  # fmt: skip
    return Plan(config, committed, spans, refused, aged, frozenset(unreadable), stored)


def _replay_all(settings: Settings, store: RedisStore, plan: Plan) -> Replaying:
    """Replay the plan's spans through a replaying intake with a consumer of its own."""
    consumer = Consumer({**clients.consumer_config(settings), "group.id": "blackbox-rebuild",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        intake = _replaying(settings, store, consumer, plan)
        intake.counts.aged_out_records = plan.aged_out
        if plan.stored is not None:
            restore(intake, store, plan.stored, settings.store_topic,
                    indexing=settings.storage_mode == "index")  # fmt: skip
        replay(intake, consumer, plan.spans)
    finally:
        consumer.close()
    return intake


def _replaying(settings: Settings, store: RedisStore, consumer: Consumer, plan: Plan) -> Replaying:
    """The replaying intake, wired as the service wires its intake (runner.py)."""
    return Replaying(
        consumer, store, answers_outbox(settings), plan.config, Metrics(),
        incarnations=Incarnations(clients.topic_id_lookup(settings.kafka),
                                  RedisRecord(store.client, store.layout)),
        # Notes of the offsets in hand only: none is left ahead for the service's intake.
        guard=CrashGuard(store.client, store.layout.intake_handling, ahead=0),
        nonces=Nonces(store.client, store.layout), config_kafka=dict(settings.kafka),
        letters=plan.refused, committed=plan.committed, unreadable=plan.unreadable,
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

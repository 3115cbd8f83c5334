"""Gaps: intake partitions whose records Redis no longer holds, found and read again.

The intake commits a record's offset once Redis applied it, but Redis may lose that write
afterwards: a primary fails over to a replica that had not received it yet (replication is
asynchronous), an operator restores an older snapshot, a Redis comes back empty. Kafka
still holds every record; Redis holds, per shard, the watermark of each partition
(watermarks.py). A partition whose marks are below what its group committed, or below
what this process saw Redis confirm, has a gap: the records past the lowest mark are read
again (re-reads are idempotent: what Redis still holds is skipped).

What Redis is decides first (clocks.py): a Redis flushed or restarted empty, or restored
from a snapshot older than a failover's lag can be (BLACKBOX_REDIS_MAX_LAG), lost data
however few records lie behind, and every partition is judged so. Then, a gap too large to
be a failover's lag (`BLACKBOX_REREAD_LIMIT` records), a partition with committed offsets
and no watermark at all, a gap whose first records Kafka no longer holds (below the
partition's log start offset: deleted by retention), or committed offsets below it
(records Kafka deleted before intake read them) is lost data, not lag: reading hours of
requests again would deliver again much that fired since, and what Kafka deleted cannot be
read again at all (the consumer would go on from the oldest record left, silently). The
intake then stops reading that partition and says so (`BLACKBOX_REDIS_LOSS=stop`, the
default) until the operator rebuilds Redis or chooses:
`reread` reads the whole gap again (duplicates of what fired since, under the same ids),
`skip` goes on from the committed offsets (the gap's schedules given up, counted). Records
Kafka no longer holds are given up either way, and counted.

Partitions are checked when assigned (against the group's commits), after any Redis
failure the intake meets, and every CHECK_SECONDS against what this process saw confirmed;
each check looks at the shards' clocks first, and moves them on where Redis was found whole.
Lost data found by the clocks is left marked in Redis: firing claims nothing there, and
every process holds, until a rebuild or the operator's BLACKBOX_REDIS_LOSS acts on it.
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import redis
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from blackbox.backoff import Backoff
from blackbox.clock import now_ms
from blackbox.metrics import Metrics
from blackbox.storage import watermarks
from blackbox.storage.clocks import DEFAULT_MAX_LAG_SECONDS, Clocks, Reading
from blackbox.storage.store import RedisStore
from blackbox.storage.watermarks import Marks, Watermarks

log = structlog.get_logger("blackbox.intake.gaps")

# How often partitions are checked against what this process saw Redis confirm, seconds:
# one HMGET per shard, so a failover met while intake is idle is found within this.
CHECK_SECONDS = 5.0
# How often a stopped partition is checked again (an operator may have rebuilt Redis).
STOPPED_CHECK_SECONDS = 30.0
# How long firers recheck what falls due after a gap is read again, in longest lags
# (BLACKBOX_REDIS_MAX_LAG): the re-read of a gap within BLACKBOX_REREAD_LIMIT is over by then.
RECHECK_LAGS = 10
# How long the group's committed offsets are asked for, seconds.
COMMITTED_TIMEOUT = 10.0

Partition = tuple[str, int]


class Loss(enum.StrEnum):
    """What intake does with a partition whose Redis lost data (BLACKBOX_REDIS_LOSS)."""

    STOP = "stop"  # stop reading it and say so (the default)
    REREAD = "reread"  # read the whole gap again: firers pass over what Kafka shows delivered
    SKIP = "skip"  # go on from the committed offsets: the gap's schedules are given up


class Kind(enum.StrEnum):
    """What a check found in one partition."""

    FINE = "fine"
    LAG = "lag"  # a gap within the re-read limit: read again
    FAR_BEHIND = "far_behind"  # a gap over the limit: lost data
    NO_WATERMARK = "no_watermark"  # committed offsets, and no mark at all: lost data
    AGED_OUT = "aged_out"  # a lag whose first records Kafka no longer holds: lost data
    FLUSHED = "flushed"  # Redis came back without its clock: flushed, or restarted empty
    RESTORED = "restored"  # its clock went back beyond a failover's lag: an old snapshot
    DELETED_UNREAD = "deleted_unread"  # committed below Kafka's log start: never read


# Lost data of the whole Redis, not of one partition: found by its clocks, left marked there.
REDIS_WIDE = frozenset({Kind.FLUSHED, Kind.RESTORED})


@dataclass(frozen=True, slots=True)
class Verdict:
    """A check's finding: the gap's first offset, the offset below which every record was
    handled before (both 0 where fine), and the partition's first offset Kafka still holds
    (its log start offset, where asked)."""

    kind: Kind
    start: int = 0
    end: int = 0
    kept_from: int = 0

    @property
    def records(self) -> int:
        """How many records the gap holds at most."""
        return max(0, self.end - self.start)

    @property
    def aged_out(self) -> int:
        """How many of the gap's records Kafka no longer holds: they cannot be read again."""
        return max(0, min(self.kept_from, self.end) - self.start)

    @property
    def lost(self) -> bool:
        return self.kind not in (Kind.FINE, Kind.LAG)


FINE = Verdict(Kind.FINE)


def verdict(
    marks: Marks, known: Marks, committed: int | None, limit: int, *, refreshed: bool = True
) -> Verdict:
    """Judge one partition from every shard's mark in Redis (`marks`), the marks this
    process saw confirmed (`known`) and the group's committed offset (None: not asked, or
    none). A shard without a mark counts as -1 where this process saw it hold one, and is
    left out where it never did (it may have received no record of the partition).

    Against the commit, the lowest mark counts where every shard's mark is kept refreshed
    (`refreshed`); where an older release wrote them, each mark is exact for its own shard
    only and may lag any distance, so the newest counts (a failover during the upgrade is
    then found by the marks this process sees confirmed, from its first write on)."""
    floor = [_floor(m, k, refreshed) for m, k in zip(marks, known, strict=True)]
    present = [m for m in floor if m is not None]
    if not present:
        if committed:  # offsets past 0 were committed, and Redis has no trace of them
            return Verdict(Kind.NO_WATERMARK, 0, committed)
        return FINE
    starts = [
        m + 1
        for m, k in zip(floor, known, strict=True)
        if m is not None and k is not None and m < k
    ]
    reference = min(present) if refreshed else max(present)
    if committed is not None and reference + 1 < committed:
        starts.append(reference + 1)
    if not starts:
        return FINE
    start = min(starts)
    end = max([committed or 0, *(k + 1 for k in known if k is not None)])
    return Verdict(Kind.LAG if end - start <= limit else Kind.FAR_BEHIND, start, end)


def held_by_kafka(found: Verdict, log_start: int) -> Verdict:
    """`found` once the partition's log start offset is known: a failover's lag that begins
    below it cannot be read again in full, so it is lost data (AGED_OUT); a gap already
    lost keeps its kind, and notes what Kafka no longer holds of it."""
    if found.kind is Kind.FINE:
        return found
    aged = replace(found, kept_from=log_start)
    return replace(aged, kind=Kind.AGED_OUT) if aged.aged_out and found.kind is Kind.LAG else aged


def unread_deleted(committed: int | None, log_start: int) -> Verdict:
    """A partition judged fine whose committed offset lies below Kafka's log start offset:
    the records between were deleted before intake read them (the consumer would go on from
    the oldest record left, silently): lost data, DELETED_UNREAD; else FINE."""
    if committed is None or committed >= log_start:
        return FINE
    return Verdict(Kind.DELETED_UNREAD, committed, log_start, log_start)


def redis_wide(found: Verdict, kind: Kind, committed: int | None) -> Verdict:
    """`found` where the clocks found Redis lost data (`kind`): the partition is lost data
    of that kind; a gap keeps its records to read again, a partition found fine has none."""
    if found.kind is Kind.FINE:
        end = committed or 0
        return Verdict(kind, end, end)
    return replace(found, kind=kind)


def clock_loss(clocks: Sequence[Reading]) -> Kind | None:
    """What the shards' clocks say Redis lost (the first shard's that says any), or None."""
    for clock in clocks:
        if clock.lost is not None:
            return Kind(clock.lost) if clock.lost in Kind.__members__.values() else Kind.RESTORED
    return None


def _floor(mark: int | None, known: int | None, refreshed: bool) -> int | None:
    """A shard's mark as judged: -1 for a mark Redis lost (one this process saw, or any of
    a field whose every shard is marked: see `Watermarks`), None for one it never had."""
    if mark is not None:
        return mark
    return -1 if known is not None or refreshed else None


@dataclass(frozen=True, slots=True)
class GapConfig:
    """How large a gap is read again by itself, and what is done with a larger one."""

    reread_limit: int = 100_000  # BLACKBOX_REREAD_LIMIT's default
    loss: Loss = Loss.STOP
    max_lag_ms: int = int(DEFAULT_MAX_LAG_SECONDS * 1000)  # BLACKBOX_REDIS_MAX_LAG's


class GapCheck:
    """Finds the gaps of the intake's partitions and has them read again, or stops them.

    `seek(topic, partition, offset)` moves the consumer (the intake's rewind, which also
    tells its incarnations); `tag(topic)` names a topic's incarnation; `on_stopped` is told
    the partitions stopped for lost data whenever they change (health, /ready).
    """

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self, consumer: Consumer, store: RedisStore, known: Watermarks, config: GapConfig,
        metrics: Metrics, *, seek: Callable[[str, int, int], None],
        tag: Callable[[str], str], on_stopped: Callable[[Sequence[Partition]], None],
    ) -> None:  # fmt: skip
        self.consumer = consumer
        self.store = store
        self.known = known
        self.config = config
        self.metrics = metrics
        self.seek = seek
        self.tag = tag
        self.on_stopped = on_stopped
        self.assigned: set[Partition] = set()
        self.unchecked: set[Partition] = set()  # asked against the group's commits
        self.stopped: dict[Partition, Verdict] = {}
        # Per partition read again: the offset below which every record was handled before.
        self.rereading: dict[Partition, int] = {}
        self._next_check = time.monotonic() + CHECK_SECONDS
        self._next_stopped_check = 0.0
        self._backoff = Backoff(base=0.2, cap=5.0)
        self._retry_at = 0.0

    @functools.cached_property
    def clocks(self) -> Clocks:
        """The shards' clocks as this process saw them (made at the first check)."""
        return Clocks(self.store.client, self.store.layout, self.config.max_lag_ms,
                      self.store.beat_all)  # fmt: skip

    def assign(self, partitions: Iterable[Partition]) -> None:
        """Newly assigned partitions: none is read before it is checked."""
        partitions = set(partitions)
        self.assigned |= partitions
        self.unchecked |= partitions
        self.known.forget(partitions)

    def revoke(self, partitions: Iterable[Partition]) -> None:
        partitions = set(partitions)
        self.assigned -= partitions
        self.unchecked -= partitions
        for partition in partitions:
            self.rereading.pop(partition, None)
        for partition in partitions & set(self.stopped):
            del self.stopped[partition]
        self.on_stopped(sorted(self.stopped))

    def suspect(self) -> None:
        """Redis failed under the intake: check every partition against the commits too."""
        self.unchecked |= self.assigned - set(self.stopped)

    @property
    def holding(self) -> bool:
        """Whether any partition's records must not be handled now."""
        return bool(self.unchecked or self.stopped)

    def held(self, partition: Partition) -> bool:
        """Whether the partition's records must not be handled now (unchecked or stopped)."""
        return partition in self.unchecked or partition in self.stopped

    def handled_before(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the record was handled before a gap made intake read it again: its dead
        letter and answer were sent then (a refusal needs no Redis), so they are not again."""
        return offset < self.rereading.get((topic, partition), -1)

    def _field(self, partition: Partition) -> str:
        topic, number = partition
        tag = self.tag(topic)
        return f"{topic}:{number}:{tag}" if tag else f"{topic}:{number}"

    def run(self) -> None:
        """Check what is due for a check; a Redis or Kafka failure leaves it for next time."""
        now = time.monotonic()
        if now < self._retry_at:  # the last check failed: Redis or Kafka is away
            return
        routine = now >= self._next_check
        again = bool(self.stopped) and now >= self._next_stopped_check
        if not (self.unchecked or routine or again):
            return
        asked = set(self.unchecked)
        if again:
            asked |= set(self.stopped)
            self._next_stopped_check = now + STOPPED_CHECK_SECONDS
        plain = self.assigned - asked - set(self.stopped) if routine else set()
        try:
            self._check(sorted(asked), sorted(plain))
        except (redis.RedisError, KafkaException) as e:
            delay = self._backoff.next()
            self._retry_at = now + delay
            log.warning("intake_gap_check_failed", error=str(e), retry_in_s=round(delay, 2))
            self.suspect()  # Redis may come back as another primary: judge against the commits
            return
        self._backoff.reset()
        if routine:
            self._next_check = now + CHECK_SECONDS

    def _check(self, asked: list[Partition], plain: list[Partition]) -> None:
        """Judge `asked` against the group's commits and `plain` against what this process
        saw confirmed, after what the shards' clocks say of Redis as a whole; then act on
        each verdict, and move the clocks on where Redis was found whole."""
        now = now_ms()
        wide = clock_loss(self.clocks.look(now))
        committed = self._committed(asked)
        partitions = asked + plain
        fields = [self._field(p) for p in partitions]
        marks = watermarks.read(self.store.client, self.store.layout, fields)
        refreshed = watermarks.refreshed(self.store.client, self.store.layout, fields)
        found_all = []
        for partition, field in zip(partitions, fields, strict=True):
            known = self.known.known(field, self.store.layout.count)
            found = verdict(marks[field], known, committed.get(partition),
                            self.config.reread_limit, refreshed=field in refreshed)  # fmt: skip
            found = self._against_kafka(partition, found, committed, wide)
            if wide is None and found.kind is Kind.RESTORED:  # found at start, by Kafka's times
                wide = Kind.RESTORED
            found_all.append(found)
            if found.kind is not Kind.FINE:  # the marks to write on from (see watermarks.py)
                self.known.reset(field, marks[field])
            else:  # what Redis holds now: a later failover below it is found by the next write
                self.known.adopt(field, marks[field])
        if wide is not None:
            found_all = [redis_wide(found, wide, committed.get(p))
                         for p, found in zip(partitions, found_all, strict=True)]  # fmt: skip
        for partition, field, found in zip(partitions, fields, found_all, strict=True):
            self._act(partition, field, found, committed.get(partition))
        self._after(wide, now)
        self.on_stopped(sorted(self.stopped))

    def _against_kafka(
        self, partition: Partition, found: Verdict, committed: dict[Partition, int | None],
        wide: Kind | None,
    ) -> Verdict:  # fmt: skip
        """`found` once Kafka was asked what it holds of the partition (asked partitions,
        and gaps): records deleted unread or before a re-read, and a gap whose records were
        written longer after the shards' clocks than a failover's lag can span."""
        if partition not in committed and found.kind is Kind.FINE:
            return found  # judged against what this process saw: Kafka need not be asked
        log_start = self._log_start(partition)
        if found.kind is Kind.FINE:
            return unread_deleted(committed.get(partition), log_start)
        found = held_by_kafka(found, log_start)
        if (
            partition in committed
            and wide is None
            and found.kind is Kind.LAG
            and self._written_after_clocks(partition, found)
        ):
            return replace(found, kind=Kind.RESTORED)
        return found

    def _written_after_clocks(self, partition: Partition, found: Verdict) -> bool:
        """Whether a record of the gap was written more than a failover's lag after the
        oldest clock of the shards (a snapshot restored while no process watched)."""
        oldest = self.clocks.oldest_ms()
        if oldest is None:
            return False
        asked = TopicPartition(*partition, oldest + self.config.max_lag_ms)
        (first,) = self.consumer.offsets_for_times([asked], timeout=COMMITTED_TIMEOUT)
        return found.start <= first.offset < found.end

    def _after(self, wide: Kind | None, now: int) -> None:
        """Leave Redis-wide lost data marked (firing holds on it, restarts hold again), or,
        where the operator chose (BLACKBOX_REDIS_LOSS) and it was acted on, clear it; move
        the clocks on where Redis was found whole."""
        if wide is None:
            self._move_clocks(now)
        elif self.config.loss is Loss.STOP:
            self.clocks.mark_lost(range(self.store.layout.count), wide.value, now,
                                  "see the log line intake_stopped_redis_lost_data")  # fmt: skip
        else:
            self.clocks.restart(now)
            log.warning("redis_loss_acted_on", kind=wide.value, action=self.config.loss.value)

    def record_refreshed(self) -> None:
        """Record in Redis the fields whose every shard this process has marked: from now on
        their lowest mark is judged against the commit (see `verdict`)."""
        fields = self.known.unrecorded(self.store.layout.count)
        if fields:
            watermarks.record_refreshed(self.store.client, self.store.layout, fields)
            self.known.recorded(fields)

    def _committed(self, partitions: list[Partition]) -> dict[Partition, int | None]:
        if not partitions:
            return {}
        asked = [TopicPartition(t, p) for t, p in partitions]
        found = self.consumer.committed(asked, timeout=COMMITTED_TIMEOUT)
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found}

    def _log_start(self, partition: Partition) -> int:
        """The partition's first offset Kafka still holds (KafkaException if it cannot
        tell: the check is tried again)."""
        asked = TopicPartition(*partition)
        found = self.consumer.get_watermark_offsets(asked, timeout=COMMITTED_TIMEOUT, cached=False)
        if found is None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "log start offset not told"))
        return int(found[0])

    def _act(self, partition: Partition, field: str, found: Verdict, committed: int | None) -> None:
        if not found.lost:
            self._resume(partition)
            if found.kind is Kind.LAG:
                self.metrics.redis_gaps.labels(kind=found.kind.value).inc()
                self._reread(partition, found, "lag")
            self.unchecked.discard(partition)
            return
        self.metrics.redis_gaps.labels(kind=found.kind.value).inc()
        if self.config.loss is Loss.REREAD:
            self._resume(partition)
            self._reread(partition, found, "operator")
        elif self.config.loss is Loss.SKIP:
            self._resume(partition)
            self._skip(partition, field, found, committed)
        else:
            self._stop(partition, found)
        self.unchecked.discard(partition)

    def _reread(self, partition: Partition, found: Verdict, why: str) -> None:
        """Read the partition again from the verdict's start, or from the first record Kafka
        still holds (what it no longer holds is given up, and said so)."""
        if found.aged_out:
            self.metrics.given_up_records.inc(found.aged_out)
            log.error("intake_gap_given_up", topic=partition[0], partition=partition[1],
                      kind=found.kind.value, records=found.aged_out, start=found.start,
                      kafka_log_start=found.kept_from, why="deleted from Kafka (retention) "
                      "before they could be read again")  # fmt: skip
        start = max(found.start, found.kept_from)
        records = max(0, found.end - start)
        self._mark_recheck()
        self.seek(partition[0], partition[1], start)
        self.rereading[partition] = max(self.rereading.get(partition, -1), found.end)
        self.metrics.reread_records.inc(records)
        level = log.info if why == "lag" else log.warning
        level("intake_reread", topic=partition[0], partition=partition[1], kind=found.kind.value,
              start=start, records=records, why=why)  # fmt: skip

    def _move_clocks(self, now: int) -> None:
        """Move the clocks on, each to the server serving its shard now. Where a clock was
        last moved on another server (Redis restarted, failed over or was restored since;
        this process may not have watched), what fired meanwhile may be due again: every
        firer rechecks it (`_mark_recheck`)."""
        oldest = self.clocks.oldest_ms()  # as found before they move
        servers = self.store.run_ids()
        found = self.clocks.look(now, write=True, servers=servers)
        moved = [shard for shard, (clock, server) in enumerate(zip(found, servers, strict=True))
                 if clock.server is not None and clock.server != server]  # fmt: skip
        if moved:
            log.warning("redis_server_changed", shards=moved, clocks_at_ms=oldest,
                        recheck="what fired since the clocks is not delivered again")  # fmt: skip
            self._mark_recheck(oldest)

    def _mark_recheck(self, oldest: int | None = None) -> None:
        """Before a gap is read again: what fired since Redis lost it must not fire again,
        so every firer rechecks, for RECHECK_LAGS times the longest lag, what falls due
        against what the target topics show delivered since the oldest clock the shards
        showed, less the longest lag (a flush left none: since the topics' start)."""
        now, lag = now_ms(), self.config.max_lag_ms
        oldest = self.clocks.oldest_ms() if oldest is None else oldest
        since = 0 if oldest is None else max(0, oldest - lag)
        self.clocks.mark_recheck(since, now + RECHECK_LAGS * lag)

    def _skip(
        self, partition: Partition, field: str, found: Verdict, committed: int | None
    ) -> None:
        """Give the gap up: Redis's marks move to the committed offset, intake goes on."""
        if committed is not None:
            watermarks.raise_to(self.store.client, self.store.layout, field, committed - 1)
        self.metrics.given_up_records.inc(found.records)
        log.error("intake_gap_given_up", topic=partition[0], partition=partition[1],
                  kind=found.kind.value, records=found.records, committed=committed)  # fmt: skip

    def _stop(self, partition: Partition, found: Verdict) -> None:
        if partition not in self.stopped:
            log.error(
                "intake_stopped_redis_lost_data", topic=partition[0], partition=partition[1],
                kind=found.kind.value, records=found.records, start=found.start,
                aged_out=found.aged_out, kafka_log_start=found.kept_from,
                action="rebuild Redis from Kafka (blackbox rebuild), or restart with "
                "BLACKBOX_REDIS_LOSS=reread (deliver the gap again) or =skip (give it up); "
                "records Kafka no longer holds (aged_out) are lost either way",
            )  # fmt: skip
        self.stopped[partition] = found
        self._pause([partition])

    def _resume(self, partition: Partition) -> None:
        if self.stopped.pop(partition, None) is not None:
            log.info("intake_partition_resumed", topic=partition[0], partition=partition[1])
            self.consumer.resume([TopicPartition(*partition)])

    def _pause(self, partitions: list[Partition]) -> None:
        self.consumer.pause([TopicPartition(t, p) for t, p in partitions])

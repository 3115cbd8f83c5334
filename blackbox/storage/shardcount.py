"""The shard count a namespace's data was written with, checked at every start.

A message's shard is a function of its id and the shard count, so a count changed under
pending messages would look for them in the wrong shards: their updates and cancels would
miss, and no one would claim them. The count is kept in Redis (`Layout.shard_count`):
starting with another count is refused while anything is pending in the old layout, or
while another process (of any role) still runs with it, and allowed once the namespace is
empty and quiet. The intake watermarks are then carried over, so records re-read after
the change are recognised as applied (change it after a clean stop, SIGTERM, and nothing
is re-read at all).

Every process keeps a heartbeat in `Layout.processes` while its count is the recorded one
(shards.lua writes both together), renewed at each readiness probe: an intake process
still on the old count blocks a change as a firing one does.

A process started without BLACKBOX_SHARDS adopts the count the namespace was written with
(`adopt`), so a deployment upgraded from a release whose default was one shard keeps it
rather than being refused; a new namespace gets DEFAULT_SHARDS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from blackbox.errors import ShardsChanged
from blackbox.storage import scripts
from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout
from blackbox.storage.store import pending_counts

log = structlog.get_logger("blackbox.storage.shardcount")

# A new namespace's shard count when BLACKBOX_SHARDS is unset: enough that any realistic
# number of firing replicas shares the work (each owns a shard at least), few enough that
# a sweep stays cheap (one claim per shard another process owns, per tick).
DEFAULT_SHARDS = 16
# A process's heartbeat lives this many probe intervals, at least MIN_HEARTBEAT_MS.
HEARTBEAT_INTERVALS = 3
MIN_HEARTBEAT_MS = 5_000

Partition = tuple[str, int]
# The intake consumer group's committed offset of each partition (None: none committed).
Committed = Callable[[Iterable[Partition]], Mapping[Partition, int | None]]


def recorded_count(client: RedisClient, layout: Layout) -> int | None:
    """The shard count stored for the namespace; None where none is (new, or written
    before shards existed: one shard)."""
    raw: Any = client.get(layout.shard_count)
    return None if raw is None else int(raw)


def adopt(client: RedisClient, namespace: str) -> int:
    """The shard count to run with when BLACKBOX_SHARDS is unset: the one recorded for the
    namespace; one where data was written before counts were recorded (pending messages
    or intake watermarks in the single shard); DEFAULT_SHARDS for a new namespace."""
    single = Layout(namespace, 1)
    recorded = recorded_count(client, single)
    if recorded is not None:
        count, why = recorded, "recorded"
    elif sum(pending_counts(client, single)) or client.exists(single.shards[0].intake_marks):
        count, why = 1, "written before shard counts were recorded"
    else:
        return DEFAULT_SHARDS
    if count != DEFAULT_SHARDS:
        log.info("shards_adopted", shards=count, why=why, default=DEFAULT_SHARDS,
                 hint="set BLACKBOX_SHARDS to change it once nothing is pending")  # fmt: skip
    return count


def heartbeat_ms(probe_interval_s: float) -> int:
    """How long a process's heartbeat lives: a few probe intervals, at least
    MIN_HEARTBEAT_MS."""
    return max(MIN_HEARTBEAT_MS, int(HEARTBEAT_INTERVALS * probe_interval_s * 1000))


class Guard:
    """This process's side of the shard-count guard: `settle` at start, `verify` at each
    readiness probe (renewing the heartbeat), `leave` on a clean stop."""

    def __init__(
        self, client: RedisClient, layout: Layout, name: str, heartbeat_ms: int = MIN_HEARTBEAT_MS
    ) -> None:
        self.client, self.layout, self.name = client, layout, name
        self.heartbeat_ms = heartbeat_ms
        text = scripts.source("shards")
        self._script = client.register_script(text)

    def _call(
        self, now_ms: int, mode: str, before: int | None = None
    ) -> tuple[str, int | None, int]:
        keys = [self.layout.shard_count, self.layout.processes, self.layout.members]
        expiry = now_ms + self.heartbeat_ms
        args: list[str | int] = [self.layout.count, now_ms, self.name, expiry, mode,
                                 "" if before is None else before]  # fmt: skip
        outcome, recorded, others = self._script(keys=keys, args=args)
        return outcome.decode(), None if not recorded else int(recorded), int(others)

    def verify(self, now_ms: int) -> None:
        """Renew this process's heartbeat; raise ShardsChanged if another process recorded
        another shard count since `settle`: this one would write where no one looks. A
        count Redis no longer holds at all (flushed, restarted empty) is recorded again and
        said: the shards' clocks hold intake and firing on such a Redis (clocks.py)."""
        outcome, recorded, _ = self._call(now_ms, "keep")
        if outcome != "ok" and recorded is None:
            outcome, recorded, _ = self._call(now_ms, "change")
            log.error("shard_count_lost", namespace=self.layout.namespace,
                      shards=self.layout.count, recorded_again=outcome == "ok",
                      why="Redis was flushed, restarted empty or restored from an older "
                      "snapshot: intake and firing hold until the operator acts")  # fmt: skip
        if outcome != "ok":
            raise ShardsChanged(
                f"BLACKBOX_SHARDS={self.layout.count}, but another process changed namespace "
                f"{self.layout.namespace!r} to {recorded} shards: stopping. Run every process "
                "with the same count."
            )

    def settle(self, now_ms: int, committed: Committed | None = None) -> None:
        """Make this process's layout the namespace's (its heartbeat written with it), or
        raise ShardsChanged if messages are pending in another one, or other processes
        still run (they would go on writing or firing in it). `committed` gives the intake
        group's committed offsets, for the watermarks carried over."""
        outcome, recorded, _ = self._call(now_ms, "keep")
        if outcome == "ok":
            return
        old = Layout(self.layout.namespace, recorded or 1)
        try:
            if old.count != self.layout.count:
                self._refuse_if_busy(old, now_ms)
                self._refuse_if_pending(old)
                carried = _carry_marks(self.client, old, self.layout, committed)
                log.info("shards_changed", before=old.count, after=self.layout.count,
                         marks=carried)  # fmt: skip
            outcome, _, others = self._call(now_ms, "change", recorded)
            if outcome != "ok":
                raise self._busy(old, others)
        except ShardsChanged:
            # Processes started together on a fresh namespace: another one recorded this
            # very count between the first look and now, and runs with it.
            if recorded is None and self._call(now_ms, "keep")[0] == "ok":
                return
            raise

    def _refuse_if_busy(self, old: Layout, now_ms: int) -> None:
        """Checked before the watermarks are carried (shards.lua checks again with the
        change): the new layout's keys may share tags with the old one's. This process's
        own heartbeat is not another's (its firing may have beaten before the settle, as
        shards.lua counts it)."""
        running = 0
        for key in (self.layout.processes, self.layout.members):
            running += int(self.client.zcount(key, f"({now_ms}", "+inf"))
            mine = self.client.zscore(key, self.name)
            if mine is not None and mine > now_ms:
                running -= 1
        if running:
            raise self._busy(old, running)

    def _busy(self, old: Layout, running: int) -> ShardsChanged:
        return ShardsChanged(
            f"BLACKBOX_SHARDS={self.layout.count}, but {running} process(es) still run "
            f"namespace {self.layout.namespace!r} with {old.count} shard(s) (their heartbeats "
            "in Redis). Stop every process before changing the shard count."
        )

    def _refuse_if_pending(self, old: Layout) -> None:
        pending = sum(pending_counts(self.client, old))
        if pending:
            raise ShardsChanged(
                f"BLACKBOX_SHARDS={self.layout.count}, but {pending} messages are pending in "
                f"namespace {self.layout.namespace!r} written with {old.count} shard(s). Run "
                f"with BLACKBOX_SHARDS={old.count} (or leave it unset: the recorded count is "
                "kept), or change it once nothing is pending (stop intake, let the "
                "dispatchers fire what is due, and stop every replica)."
            )

    def leave(self) -> None:
        """Drop this process's heartbeat (a clean stop): a change need not wait for it."""
        self.client.zrem(self.layout.processes, self.name)


def _carry_marks(
    client: RedisClient, old: Layout, new: Layout, committed: Committed | None = None
) -> int:
    """Give every new shard, per intake partition, the lowest watermark the old shards
    holding one have for it; how many partitions were carried.

    The lowest, because a crash may have left one old shard's part of a record range
    unapplied while another's moved past it: re-reading that range may schedule a message
    twice (its id names the delivery), never skip one. An old shard without a mark of the
    partition received none of its records, or had its calls refused while another
    shard's ran (intake then rewinds and re-reads, committing nothing past them): so where
    a shard lacks the mark, the mark carried is at most the last offset the intake group
    committed, below which every shard's part was applied."""
    per_shard: list[dict[bytes, int]] = []
    for keys in old.shards:
        marks: Any = client.hgetall(keys.intake_marks)
        per_shard.append({name: int(value) for name, value in marks.items()})
    names = {name for marks in per_shard for name in marks}
    lowest = {n: min(m[n] for m in per_shard if n in m) for n in names}
    gaps = {n for n in names if any(n not in m for m in per_shard)}
    _cap_at_commits(lowest, gaps, committed)
    pipe = client.pipeline(transaction=False)
    for keys in new.shards:  # a new shard may share its tag with an old one: replace
        pipe.delete(keys.intake_marks)
        if lowest:
            pipe.hset(keys.intake_marks, mapping={k: str(v) for k, v in lowest.items()})
    pipe.execute()
    return len(lowest)


def _cap_at_commits(
    lowest: dict[bytes, int], gaps: set[bytes], committed: Committed | None
) -> None:
    """Lower the marks of the partitions in `gaps` to the last offset their intake group
    committed ("topic:partition[:incarnation]" names the partition); a partition with no
    commit keeps its lowest mark; without `committed` they start over."""
    if not gaps:
        return
    if committed is None:  # unknown: such a partition starts over (re-read, never skipped)
        for name in gaps:
            del lowest[name]
        return
    where = {name: _partition(name) for name in gaps}
    offsets = committed({p for p in where.values() if p is not None})
    for name, partition in where.items():
        offset = None if partition is None else offsets.get(partition)
        if offset is not None:
            lowest[name] = min(lowest[name], offset - 1)


def _partition(name: bytes) -> Partition | None:
    """The (topic, partition) a watermark field names; None for one that does not parse."""
    parts = name.decode("utf-8", "replace").split(":")
    if len(parts) < 2 or not parts[1].isdigit():  # topic:partition[:tag]
        return None
    return parts[0], int(parts[1])

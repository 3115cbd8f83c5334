"""Watermarks: what Redis holds of each intake partition, and what this process saw it hold.

Every shard keeps its own watermark of each intake partition (intake.lua moves it in the
step that applies the partition's requests for that shard): a request at or below its
shard's mark was applied. Redis may lose the newest of those steps (an asynchronously
replicated primary failing over, a restore from an older snapshot) while the intake group
has already committed past them; the intake then reads again from the lowest mark.

So that the lowest mark stays close to the newest, intake keeps in `Watermarks` the mark
each shard was last confirmed at by this process, and moves along (with a call that
applies nothing) a shard whose mark of a partition fell `REFRESH_OFFSETS` behind, or that
this process has not marked yet. The same record tells whether Redis went back below what
it once confirmed: intake's next call to such a shard refuses to run (intake.lua's
BLACKBOX_GAP: a newer request applied on top of the lost ones would move the mark past
them), and a periodic check compares the two while intake is idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout

# How far (in offsets) a shard's mark of a partition may fall behind the partition's last
# record before intake moves it along: bounds what a check reads again after a restart or
# a rebalance (a few milliseconds of re-reads) at one extra call per shard per as many
# records.
REFRESH_OFFSETS = 1000

Marks = list[int | None]  # per shard: its mark of one partition, None where it has none


class Watermarks:
    """The marks this process saw Redis confirm, per watermark field and shard."""

    def __init__(self) -> None:
        self._confirmed: dict[str, dict[int, int]] = {}  # field -> shard -> mark
        self._recorded: set[str] = set()  # fields recorded as refreshed in Redis

    def unrecorded(self, shards: int) -> list[str]:
        """The fields whose every shard's mark this process confirmed, not yet recorded as
        kept refreshed (see `record_refreshed`)."""
        return [field for field, known in self._confirmed.items()
                if len(known) == shards and field not in self._recorded]  # fmt: skip

    def recorded(self, fields: Iterable[str]) -> None:
        self._recorded.update(fields)

    def known(self, field: str, shards: int) -> Marks:
        """Per shard of `shards`, the last mark of `field` Redis confirmed to this process
        (None: none)."""
        known = self._confirmed.get(field, {})
        return [known.get(shard) for shard in range(shards)]

    def mark(self, field: str, shard: int) -> int | None:
        """The last mark of `field` in `shard` Redis confirmed to this process, if any."""
        return self._confirmed.get(field, {}).get(shard)

    def adopt(self, field: str, marks: Marks) -> None:
        """Take Redis's marks of `field` where they are above what was confirmed (a check
        found nothing lost): a write that later finds Redis below them is refused."""
        known = self._confirmed.setdefault(field, {})
        for shard, mark in enumerate(marks):
            if mark is not None:
                known[shard] = max(known.get(shard, mark), mark)

    def reset(self, field: str, marks: Marks) -> None:
        """Take Redis's marks of `field` as they are now (found below what was confirmed:
        the records past them are read again)."""
        self._confirmed[field] = {s: mark for s, mark in enumerate(marks) if mark is not None}
        self._recorded.discard(field)  # Redis may have lost the record too: write it again

    def lagging(self, field: str, last_offset: int, shards: int) -> list[int]:
        """The shards of `shards` whose mark of `field` this process has not confirmed, or
        confirmed more than REFRESH_OFFSETS below `last_offset`."""
        floor = last_offset - REFRESH_OFFSETS
        return [
            s for s, mark in enumerate(self.known(field, shards)) if mark is None or mark < floor
        ]

    def confirm(self, marks: Mapping[tuple[str, int], int]) -> None:
        """Redis applied calls moving these (field, shard) marks to these offsets."""
        for (field, shard), mark in marks.items():
            known = self._confirmed.setdefault(field, {})
            known[shard] = max(known.get(shard, mark), mark)

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Another process may have written these partitions' marks (a rebalance): every
        incarnation's field ("topic:partition[:tag]") is forgotten."""
        names = {f"{topic}:{partition}" for topic, partition in partitions}
        for field in [f for f in self._confirmed if ":".join(f.split(":")[:2]) in names]:
            del self._confirmed[field]
            self._recorded.discard(field)


def read(client: RedisClient, layout: Layout, fields: Sequence[str]) -> dict[str, Marks]:
    """Per field, every shard's mark of it as Redis holds it now (one round trip per node)."""
    if not fields:
        return {}
    pipe = client.pipeline(transaction=False)
    for keys in layout.shards:
        pipe.hmget(keys.intake_marks, list(fields))
    replies = pipe.execute()
    return {
        field: [None if reply[i] is None else int(reply[i]) for reply in replies]
        for i, field in enumerate(fields)
    }


def refreshed(client: RedisClient, layout: Layout, fields: Sequence[str]) -> set[str]:
    """The fields recorded as kept refreshed: their lowest mark is within REFRESH_OFFSETS
    of the newest unless Redis lost writes (a field written only by an older release may
    lag any distance, its marks each exact for its own shard)."""
    if not fields:
        return set()
    found: Any = client.hmget(layout.refreshed_marks, list(fields))
    return {field for field, flag in zip(fields, found, strict=True) if flag is not None}


def record_refreshed(client: RedisClient, layout: Layout, fields: Sequence[str]) -> None:
    """Record that every shard's mark of `fields` is kept refreshed from now on."""
    if fields:
        client.hset(layout.refreshed_marks, mapping=dict.fromkeys(fields, 1))


def raise_to(client: RedisClient, layout: Layout, field: str, mark: int) -> None:
    """Move every shard's mark of `field` up to `mark` (never down): what lies below is
    given up. Only the partition's owner may call it (intake.lua's marks are its own)."""
    current = read(client, layout, [field])[field]
    pipe = client.pipeline(transaction=False)
    for keys, shard_mark in zip(layout.shards, current, strict=True):
        if shard_mark is None or shard_mark < mark:
            pipe.hset(keys.intake_marks, field, str(mark))
    pipe.execute()


def forget(client: RedisClient, layout: Layout, fields: Iterable[str]) -> None:
    """Drop `fields` from every shard's marks (a partition no intake reads)."""
    names = sorted(fields)
    if not names:
        return
    pipe = client.pipeline(transaction=False)
    for keys in layout.shards:
        pipe.hdel(keys.intake_marks, *names)
    pipe.execute()

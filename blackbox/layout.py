"""The shard count a namespace's data was written with, checked at every start.

A message's shard is a function of its id and the shard count, so a count changed under
pending messages would look for them in the wrong shards: their updates and cancels would
miss, and no one would claim them. The count is kept in Redis (`Layout.shard_count`):
starting with another count is refused while anything is pending in the old layout, and
allowed once it is empty (drained, or new). The intake watermarks are then carried over,
so records re-read after the change are recognised as applied (change it after a clean
stop, SIGTERM, and nothing is re-read at all).
"""

from __future__ import annotations

from typing import Any

import structlog

from blackbox.connections import RedisClient
from blackbox.errors import ShardsChanged
from blackbox.keys import Layout
from blackbox.store import pending_counts

log = structlog.get_logger("blackbox.layout")


def recorded_count(client: RedisClient, layout: Layout) -> int | None:
    """The shard count stored for the namespace; None where none is (new, or written
    before shards existed: one shard)."""
    raw: Any = client.get(layout.shard_count)
    return None if raw is None else int(raw)


def verify(client: RedisClient, layout: Layout) -> None:
    """Raise ShardsChanged if another process recorded another shard count since `settle`:
    this one would write where no one looks."""
    recorded = recorded_count(client, layout)
    if recorded is not None and recorded != layout.count:
        raise ShardsChanged(
            f"BLACKBOX_SHARDS={layout.count}, but another process changed namespace "
            f"{layout.namespace!r} to {recorded} shards: stopping. Run every process with "
            "the same count."
        )


def settle(client: RedisClient, layout: Layout, now_ms: int) -> None:
    """Make `layout` the namespace's layout, or raise ShardsChanged if messages are pending
    in another one, or other processes still fire (they would go on writing in it)."""
    recorded = recorded_count(client, layout)
    if recorded == layout.count:
        return
    old = Layout(layout.namespace, recorded or 1)
    if old.count != layout.count:
        firing = int(client.zcount(layout.members, f"({now_ms}", "+inf"))
        if firing:
            raise ShardsChanged(
                f"BLACKBOX_SHARDS={layout.count}, but {firing} process(es) still fire namespace "
                f"{layout.namespace!r} with {old.count} shard(s). Stop every process before "
                "changing the shard count."
            )
        pending = sum(pending_counts(client, old))
        if pending:
            raise ShardsChanged(
                f"BLACKBOX_SHARDS={layout.count}, but {pending} messages are pending in "
                f"namespace {layout.namespace!r} written with {old.count} shard(s). Run with "
                f"BLACKBOX_SHARDS={old.count}, or change it once nothing is pending (stop "
                "intake, let the dispatchers fire what is due, and stop every replica)."
            )
        carried = _carry_marks(client, old, layout)
        log.info("shards_changed", before=old.count, after=layout.count, marks=carried)
    client.set(layout.shard_count, layout.count)


def _carry_marks(client: RedisClient, old: Layout, new: Layout) -> int:
    """Give every new shard, per intake partition, the lowest watermark any old shard
    holds for it; how many partitions were carried. The lowest, because a crash may have
    left one old shard's part of a record range unapplied while another's moved past it:
    re-reading that range may schedule a message twice (its id names the delivery), never
    skip one."""
    per_shard: list[dict[bytes, int]] = []
    for keys in old.shards:
        marks: Any = client.hgetall(keys.intake_marks)
        per_shard.append({name: int(value) for name, value in marks.items()})
    names = {name for marks in per_shard for name in marks}
    # A shard without a mark of a partition may have had its first call refused: -1.
    lowest = {n: low for n in names if (low := min(m.get(n, -1) for m in per_shard)) >= 0}
    pipe = client.pipeline(transaction=False)
    for keys in new.shards:  # a new shard may share its tag with an old one: replace
        pipe.delete(keys.intake_marks)
        if lowest:
            pipe.hset(keys.intake_marks, mapping={k: str(v) for k, v in lowest.items()})
    pipe.execute()
    return len(lowest)

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


def settle(client: RedisClient, layout: Layout) -> None:
    """Make `layout` the namespace's layout, or raise ShardsChanged if messages are pending
    in another one."""
    recorded = recorded_count(client, layout)
    if recorded == layout.count:
        return
    old = Layout(layout.namespace, recorded or 1)
    if old.count != layout.count:
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
    lowest: dict[bytes, int] = {}
    for keys in old.shards:
        marks: Any = client.hgetall(keys.intake_marks)
        for name, value in marks.items():
            lowest[name] = min(lowest.get(name, int(value)), int(value))
    if not lowest:
        return 0
    pipe = client.pipeline(transaction=False)
    for keys in new.shards:
        pipe.hset(keys.intake_marks, mapping={k: str(v) for k, v in lowest.items()})
    pipe.execute()
    return len(lowest)

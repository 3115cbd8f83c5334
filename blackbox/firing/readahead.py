"""Read-ahead (index mode): the store records of what falls due soon, read into the
reader's cache before it is due, so that firing a burst reads nothing back then.

Every READ_AHEAD_SECONDS / 4 it looks at this replica's shards for ids due within the next
READ_AHEAD_SECONDS (at most READ_AHEAD_IDS of them), reads their payloads, and reads the
records their references name that the cache lacks, the earliest due first and no more
than half the cache holds, in one pass over the store topic. A
record it could not read is read again at the claim (batch.py), which dead-letters only
what is truly missing.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
import structlog

from blackbox.clock import now_ms
from blackbox.kafka.storetopic import StoreUnavailable
from blackbox.reference import Reference, is_reference
from blackbox.storage.store import RedisStore, StoreReader

log = structlog.get_logger("blackbox.firing.readahead")

READ_AHEAD_SECONDS = 10.0
READ_AHEAD_IDS = 100_000  # per pass: about what a 64 MB cache holds of 600-byte records


class ReadAhead:
    """Warms the reader's cache with the records of the ids due soon in `shards()`."""

    def __init__(self, store: RedisStore, reader: StoreReader, budget_bytes: int) -> None:
        """`budget_bytes`: the most record bytes one pass reads (half the cache: what is
        read ahead must still be there when it falls due)."""
        self.store = store
        self.reader = reader
        self.budget_bytes = budget_bytes
        self._seen_to_ms = 0  # due times up to this were read ahead already
        self._referenced = 0

    def run_once(self, shards: Sequence[int]) -> int:
        """One pass; how many references it looked up."""
        now = now_ms()
        since = max(now, self._seen_to_ms)
        until = now + int(READ_AHEAD_SECONDS * 1000)
        try:
            ids = self._due_between(shards, since, until)
            wanted = self._references(ids)
            if wanted:
                self.reader.values(wanted)
        except (redis.RedisError, StoreUnavailable) as e:
            log.info("read_ahead_failed", error=str(e), retry="at the next pass")
            return 0
        whole = len(ids) < READ_AHEAD_IDS and len(wanted) == self._referenced
        self._seen_to_ms = until if whole else since
        return len(wanted)

    def _due_between(self, shards: Sequence[int], since: int, until: int) -> list[str]:
        pipe = self.store.client.pipeline(transaction=False)
        for shard in shards:
            due = self.store.layout.shards[shard].due
            pipe.zrangebyscore(due, since, until, start=0, num=READ_AHEAD_IDS)
        found = [m.decode() for reply in pipe.execute() for m in reply]
        return found[:READ_AHEAD_IDS]

    def _references(self, ids: Sequence[str]) -> list[tuple[str, Reference]]:
        """The references among `ids`' payloads, the earliest due first, within the
        budget (how many there were in all: `_referenced`)."""
        payloads = self.store.payloads(ids)
        pairs = zip(ids, payloads, strict=True)
        found = [(i, Reference.decode(p)) for i, p in pairs if p is not None and is_reference(p)]
        found.sort(key=lambda r: r[1].due_ms)
        self._referenced = len(found)
        taken, budget = [], self.budget_bytes
        for schedule_id, ref in found:
            budget -= ref.size + len(schedule_id)
            if budget < 0:
                break
            taken.append((schedule_id, ref))
        return taken

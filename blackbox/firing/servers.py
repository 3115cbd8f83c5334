"""Servers: which Redis server each claim met, so that firing notices Redis changing under
it (a failover, a restart, a snapshot restored) and opens a recheck (rechecks.py) before
anything is produced: deliveries whose acks Redis lost are not made again."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from blackbox.firing.rechecks import Rechecks
from blackbox.storage.store import Claim, RedisStore

log = structlog.get_logger("blackbox.firing.servers")
# Connections whose server is remembered at most (each new one costs an INFO at its first
# claim: see `Servers.note`).
MAX_CONNECTIONS_KNOWN = 1000


class Servers:
    """The Redis server (run id) each shard's last claim met, and the recheck marks seen."""

    def __init__(self, store: RedisStore, rechecks: Rechecks) -> None:
        self.store = store
        self.rechecks = rechecks
        self._servers: dict[int, str] = {}  # shard -> run id of the Redis its last claim met
        # The connections claims came over, and the run id of the server each leads to.
        self._connections: dict[bytes, str] = {}
        self._marks: dict[int, str] = {}  # shard -> the recheck mark its last claim met

    def note(self, claims: Sequence[Claim], at: int) -> None:
        """Claims another Redis server made than their shard's last (a failover, a restart:
        looked up where a claim came over a connection not seen before), or that meet a new
        recheck mark (an intake reads a gap again): what Kafka shows delivered there lately
        is looked up before anything is produced."""
        changed, moved = [], {}  # shards that met another server; server left -> the next
        for claim in claims:
            if claim.recheck is not None and self._marks.get(claim.shard) != claim.recheck:
                self._marks[claim.shard] = claim.recheck
                self._open_marked(claim.shard, claim.recheck, at)
            if claim.connection is None:
                continue
            run_id = self._server_of(claim)
            self._against_clock(claim, run_id, at)
            before = self._servers.get(claim.shard)
            if before is not None and before != run_id:
                changed.append(claim.shard)
                moved[before] = run_id
            self._servers[claim.shard] = run_id
        if changed:
            self._open_changed(changed, moved, at)

    def _open_changed(self, changed: list[int], moved: dict[str, str], at: int) -> None:
        """Open the recheck on the shards whose claims met another server, and on those not
        claimed since that were last seen on a server left (or never seen). These moved with
        it, and their window is open: their first claims on its successor are no second
        change (each read the target topics again, about a second of firing, and logged a
        change long after the failover)."""
        changed += [s for s in range(self.store.layout.count) if s not in changed
                    and self._servers.get(s, next(iter(moved))) in moved]  # fmt: skip
        self.rechecks.open(changed, at)
        self._servers.update((s, moved[self._servers[s]]) for s in changed
                             if self._servers.get(s) in moved)  # fmt: skip
        log.warning("redis_server_changed", shards=changed,
                    recheck="what the target topics show delivered within "
                    "BLACKBOX_REDIS_MAX_LAG is not delivered again")  # fmt: skip

    def _server_of(self, claim: Claim) -> str:
        """The run id of the server a claim's connection leads to (asked once per new
        connection)."""
        assert claim.connection is not None
        run_id = self._connections.get(claim.connection)
        if run_id is None:
            run_id = self.store.run_id(claim.shard)
            if len(self._connections) >= MAX_CONNECTIONS_KNOWN:  # connections come and go
                self._connections.clear()
            self._connections[claim.connection] = run_id
        return run_id

    def _against_clock(self, claim: Claim, run_id: str, at: int) -> None:
        """A claim made on another server than the one its shard's clock was last moved on
        (Redis restarted, failed over or was restored since the last intake beat, maybe
        while this process was not running): what fired since the clock is looked up
        before anything is produced."""
        if claim.clock_server is None or claim.clock_server == run_id or not claim.clock_at_ms:
            return
        since = claim.clock_at_ms - self.rechecks.max_lag_ms
        if (
            claim.shard in self.rechecks.windows
            and since >= self.rechecks.windows[claim.shard].since_ms
        ):
            return  # one open already reaches as far back
        self.rechecks.open([claim.shard], at, since)
        log.warning("redis_server_changed", shards=[claim.shard], clock_at_ms=claim.clock_at_ms,
                    recheck="what fired since its clock is not delivered again")  # fmt: skip

    def _open_marked(self, shard: int, mark: str, at: int) -> None:
        """Open the window a recheck mark ("<since ms> <until ms>") asks for, while it runs."""
        since, _, until = mark.partition(" ")
        if since.isdigit() and until.isdigit() and at < int(until):
            self.rechecks.open([shard], at, int(since), int(until))
            log.info("recheck_opened", shard=shard, since_ms=int(since), until_ms=int(until))

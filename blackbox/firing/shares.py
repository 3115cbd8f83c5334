"""Share: the shards one replica fires, and when each is next due as far as it knows.

Replicas that fire keep a heartbeat in Redis (`Layout.members`, a sorted set scored by
expiry). At every beat a replica reads the live members and takes the shards whose index,
modulo their number, is its rank among them: every shard has one owner, the shares differ
by one shard at most, and when a replica joins or leaves (or its heartbeat runs out) the
shares move at the next beat. Ownership only spreads the work: claims stay atomic with
leases, so two replicas that both think they own a shard for a moment still never fire
one message twice.

A replica claims from its own shards when they are due, and so does not hammer the others:
a 1,000,000-message burst is drained by each replica from its own shards. The safety-net
tick also sweeps the other shards, for what is overdue by more than `sweep_after_ms`: a
dead owner's messages are fired late, not never, even before its heartbeat runs out.

The share also knows each owned shard's earliest lease expiry, as the last claim, reclaim
or probe there answered, so that the tick reclaims a shard only once a lease there can have
run out. Nothing is known (reclaim at the next tick) at start, after a share change or a
Redis error, and once what is known is older than `refresh_ms`: a lease another process
took in this replica's shard meanwhile (a sweep) is learned before it can run out, as
leases last longer than that.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Sequence
from typing import Any

import structlog

from blackbox.settings import sweep_delay
from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout

log = structlog.get_logger("blackbox.firing.shares")

# A known next due time meaning "nothing pending as of the last claim".
EMPTY = 2**62
# A replica's heartbeat lives this many poll intervals (at least MIN_TTL_MS).
TTL_INTERVALS = 3
MIN_TTL_MS = 5_000


def replica_name() -> str:
    """This process's name among the firers: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def owned_by(rank: int, members: int, shards: int) -> list[int]:
    """The shards of the member at `rank` among `members`: every `members`-th from `rank`."""
    return list(range(rank, shards, members))


class Share:
    """The shards this replica fires (all of them until its first beat) and their next due
    times: learned from claims, lowered by nudges, unknown (0: look now) when newly owned."""

    def __init__(
        self, layout: Layout, name: str | None = None, sweep_after_ms: int = 0,
        refresh_ms: int = 0,
    ) -> None:  # fmt: skip
        self.layout = layout
        self.name = name or replica_name()
        # How overdue a message of another replica's shard must be before a sweep takes it.
        self.sweep_after_ms = sweep_after_ms
        # How long a shard's known earliest lease expiry is trusted without a claim, reclaim
        # or probe there (0: not at all, every tick reclaims every owned shard).
        self.refresh_ms = refresh_ms
        self._lock = threading.Lock()
        self._owned: list[int] = list(range(layout.count))
        self._due: dict[int, int] = dict.fromkeys(self._owned, 0)
        # Per shard being claimed: the earliest due time nudged since its claim began, which
        # the claim's own answer may not have seen.
        self._nudged_since: dict[int, int] = {}
        # Per owned shard: its earliest lease expiry (0: unknown; EMPTY: no lease), and when
        # that was learned (epoch ms).
        self._expiry: dict[int, int] = dict.fromkeys(self._owned, 0)
        self._learned_at: dict[int, int] = dict.fromkeys(self._owned, 0)
        # Per shard being reclaimed: the earliest lease expiry claims reported since the
        # reclaim began, which the reclaim's own answer may not have seen.
        self._leased_since: dict[int, int] = {}
        self.members = 1

    @property
    def owned(self) -> list[int]:
        with self._lock:
            return list(self._owned)

    def others(self) -> list[int]:
        """The shards other replicas fire."""
        owned = set(self.owned)
        return [s for s in range(self.layout.count) if s not in owned]

    def due_by(self, now_ms: int) -> list[int]:
        """The owned shards due by `now_ms`, or never claimed yet."""
        with self._lock:
            return [s for s in self._owned if self._due[s] <= now_ms]

    def next_due_ms(self) -> int | None:
        """The earliest known next due time of the owned shards; None if all are empty."""
        with self._lock:
            soonest = min((self._due[s] for s in self._owned), default=EMPTY)
        return None if soonest >= EMPTY else soonest

    def claiming(self, shard: int) -> None:
        """A claim of `shard` begins: nudges from now on are kept apart for `learned`."""
        with self._lock:
            self._nudged_since[shard] = EMPTY

    def learned(self, shard: int, next_due_ms: int | None) -> None:
        """A claim of `shard` left its earliest at `next_due_ms` (None: nothing left); a
        nudge that came while it ran still counts."""
        with self._lock:
            nudged = self._nudged_since.pop(shard, EMPTY)
            if shard in self._due:
                self._due[shard] = min(EMPTY if next_due_ms is None else next_due_ms, nudged)

    def nudged(self, shard: int, due_ms: int) -> bool:
        """Something in `shard` is due at `due_ms`: True if this replica fires that shard."""
        with self._lock:
            if shard not in self._due:
                return False
            self._due[shard] = min(self._due[shard], due_ms)
            if shard in self._nudged_since:
                self._nudged_since[shard] = min(self._nudged_since[shard], due_ms)
            return True

    def expired_by(self, now_ms: int) -> list[int]:
        """The owned shards to reclaim at `now_ms`: a lease there can have run out, or
        what is known of their leases is unknown or older than `refresh_ms`."""
        stale = now_ms - self.refresh_ms
        with self._lock:
            return [s for s in self._owned
                    if self._expiry[s] <= now_ms or self._learned_at[s] <= stale]  # fmt: skip

    def leased(self, shard: int, expiry_ms: int | None, at_ms: int) -> None:
        """A claim (or a probe) of `shard` at `at_ms` saw its earliest lease expiry at
        `expiry_ms` (None: no lease)."""
        expiry = EMPTY if expiry_ms is None else expiry_ms
        with self._lock:
            if shard not in self._expiry:
                return
            self._expiry[shard], self._learned_at[shard] = expiry, at_ms
            if shard in self._leased_since:
                self._leased_since[shard] = min(self._leased_since[shard], expiry)

    def unseen(self, shards: Sequence[int], now_ms: int) -> set[int]:
        """Those of `shards` whose leases are unknown or were last looked at half of
        `refresh_ms` ago or more: their claims look at the leases too (a read more), so a
        shard claimed now and then is never reclaimed just to look."""
        stale = now_ms - self.refresh_ms // 2
        with self._lock:
            known = {s: (self._expiry[s], self._learned_at[s]) for s in shards if s in self._expiry}
        return {s for s, (expiry, learned_at) in known.items() if not expiry or learned_at <= stale}

    def leasing(self, shard: int, expiry_ms: int) -> None:
        """A claim of `shard` leased ids until `expiry_ms` (its other leases not looked at)."""
        with self._lock:
            if shard not in self._expiry:
                return
            if self._expiry[shard]:  # unknown stays unknown: reclaimed at the next tick
                self._expiry[shard] = min(self._expiry[shard], expiry_ms)
            if shard in self._leased_since:
                self._leased_since[shard] = min(self._leased_since[shard], expiry_ms)

    def reclaiming(self, shards: Sequence[int]) -> None:
        """A reclaim of `shards` begins: claims from now on are kept apart for `reclaimed`."""
        with self._lock:
            for shard in shards:
                self._leased_since[shard] = EMPTY

    def reclaimed(self, shard: int, expiry_ms: int | None, at_ms: int) -> None:
        """A reclaim of `shard` at `at_ms` left its earliest lease expiry at `expiry_ms`
        (None: no lease); a claim that leased there while it ran still counts."""
        with self._lock:
            since = self._leased_since.pop(shard, EMPTY)
            if shard in self._expiry:
                expiry = EMPTY if expiry_ms is None else expiry_ms
                self._expiry[shard], self._learned_at[shard] = min(expiry, since), at_ms

    def forget_leases(self) -> None:
        """Reclaim every owned shard at the next tick (after a Redis error: a failover may
        have lost what was known)."""
        with self._lock:
            self._expiry = dict.fromkeys(self._owned, 0)

    def beat(self, client: RedisClient, now_ms: int, ttl_ms: int) -> None:
        """Renew this replica's heartbeat, drop the expired ones, and take this replica's
        share of the live members (one round trip)."""
        pipe = client.pipeline(transaction=False)
        pipe.zadd(self.layout.members, {self.name: now_ms + ttl_ms})
        pipe.zremrangebyscore(self.layout.members, "-inf", now_ms)
        pipe.zrange(self.layout.members, 0, -1)
        members: Any = pipe.execute()[2]
        names = sorted(m.decode("utf-8") for m in members)
        if self.name not in names:  # dropped as expired by a replica whose clock runs ahead
            log.warning("share_heartbeat_dropped", replica=self.name, members=len(names))
            return
        self._take(owned_by(names.index(self.name), len(names), self.layout.count), len(names))

    def _take(self, shards: Sequence[int], members: int) -> None:
        with self._lock:
            if list(shards) == self._owned and members == self.members:
                return
            self._owned, self.members = list(shards), members
            self._due = {s: self._due.get(s, 0) for s in shards}
            # Reclaimed once at the next tick: a replica that left may have left leases.
            self._expiry = dict.fromkeys(shards, 0)
            self._learned_at = dict.fromkeys(shards, 0)
        log.info("share_changed", replica=self.name, members=members, shards=len(shards))
        if not shards:
            log.warning("share_empty", replica=self.name, members=members,
                        shards=self.layout.count, hint="more firers than BLACKBOX_SHARDS: "
                        "this one only sweeps")  # fmt: skip

    def leave(self, client: RedisClient) -> None:
        """Drop this replica's heartbeat, so the others take its shards at their next beat."""
        client.zrem(self.layout.members, self.name)


def ttl_ms(poll_interval_s: float) -> int:
    """How long a heartbeat lives: a few poll intervals, at least MIN_TTL_MS."""
    return max(MIN_TTL_MS, int(TTL_INTERVALS * poll_interval_s * 1000))


def refresh_ms(lease_seconds: float) -> int:
    """How long a shard's known earliest lease expiry is trusted: half a lease, so that a
    lease another process took there meanwhile is learned before it runs out."""
    return int(lease_seconds * 1000) // 2


def sweep_after_ms(poll_interval_s: float) -> int:
    """How overdue another replica's message must be before a sweep fires it, in ms (the
    rule is `settings.sweep_delay`, which the lease is checked against)."""
    return int(sweep_delay(poll_interval_s) * 1000)

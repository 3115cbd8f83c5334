"""Clocks: whether the Redis in front of the service is the one it wrote to, or one that
lost more than a failover's lag.

A failover to an asynchronous replica loses the writes it had not received yet: seconds,
which intake reads again from Kafka (gaps.py). A Redis flushed or restarted empty, or
restored from an older snapshot, lost more, and reading it all again would deliver again
what fired since. A count of records behind cannot tell the two apart (a flush of a young
namespace leaves few records behind, a busy failover many); time can.

Each shard keeps a clock (`Keys.clock`, beat.lua): the time an intake last judged that Redis
whole, moved every few seconds while intake runs. Each process remembers the newest clock it
saw per shard. Then:
- a shard without a clock where this process saw one was flushed or came back empty
  (`flushed`);
- a clock older than the newest this process saw by more than BLACKBOX_REDIS_MAX_LAG went
  back further than a failover's lag can take it: an older snapshot was restored
  (`restored`);
- found at start, when this process saw nothing before: a gap whose records Kafka stamped
  more than BLACKBOX_REDIS_MAX_LAG after the shard's clock (gaps.py), `restored` too.
A replica promoted with seconds of lag holds a clock within seconds of the newest: lag.

What is found is left in Redis (the clock's `lost`), so that every process holds (intake
stops, firing claims nothing: claim.lua looks at the same clock, against the floor its
process hands it) and a restart holds again, until the operator rebuilds (`blackbox
rebuild`, which clears it) or chooses with BLACKBOX_REDIS_LOSS.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout

# The longest a failover's lag may span by default (BLACKBOX_REDIS_MAX_LAG), seconds: a
# replica is seconds behind at most as Redis is usually run; an intake moves the clocks
# every few seconds (gaps.CHECK_SECONDS), which this covers many times over.
DEFAULT_MAX_LAG_SECONDS = 60.0
# What a claim refused by claim.lua's look at the clock says first.
LOST_REFUSAL = "BLACKBOX_LOST"


class State(enum.StrEnum):
    """What beat.lua found in one shard's clock."""

    OK = "ok"  # at or above the floor
    NONE = "none"  # no clock, and this process saw none: new to it
    MISSING = "missing"  # no clock where this process saw one: flushed, or restarted empty
    STALE = "stale"  # below the floor: went back further than a failover's lag
    LOST = "lost"  # marked lost, by this process or another, until the operator acts


@dataclass(frozen=True, slots=True)
class Reading:
    """One shard's clock as found: its state, its time, and the lost mark's text."""

    state: State
    at_ms: int | None = None
    mark: str | None = None
    server: str | None = None  # the run id of the Redis the clock was last moved on

    @property
    def lost(self) -> str | None:
        """What Redis lost, as a gap's kind ("flushed", "restored", ...), or None."""
        if self.state is State.MISSING:
            return "flushed"
        if self.state is State.STALE:
            return "restored"
        if self.state is State.LOST:
            return (self.mark or "lost").split(" ", 1)[0]
        return None


def reading(answer: Sequence[Any]) -> Reading:
    """beat.lua's answer as a Reading."""
    state, at, mark, server = answer
    text = mark.decode("utf-8", "replace") if isinstance(mark, bytes) else mark or None
    named = server.decode("utf-8", "replace") if isinstance(server, bytes) else server or None
    return Reading(State(state.decode() if isinstance(state, bytes) else state),
                   int(at) if at else None, text, named)  # fmt: skip


class Clocks:
    """The newest clock this process saw in each shard, and the floors they set.

    `look` reads every shard's clock (and, with `write`, moves it on); the floors it keeps
    are what claims and the next look are judged against. Not thread-safe: one per caller
    (the intake's gap check, the firing's beat)."""

    def __init__(self, client: RedisClient, layout: Layout, max_lag_ms: int, beat: Any) -> None:
        """`beat(floors, now_ms, write=...)` runs beat.lua on every shard (RedisStore.beat_all)."""
        self.client = client
        self.layout = layout
        self.max_lag_ms = max_lag_ms
        self._beat = beat
        self._seen: dict[int, int] = {}  # shard -> the newest clock seen there, epoch ms
        self.last: list[Reading] = []  # what the last look found, per shard

    def floor(self, shard: int) -> int:
        """The oldest clock `shard` may show without having lost data; -1 before one was seen."""
        seen = self._seen.get(shard)
        return -1 if seen is None else seen - self.max_lag_ms

    def floors(self) -> dict[int, int]:
        return {shard: self.floor(shard) for shard in range(self.layout.count)}

    def look(
        self, now_ms: int, *, write: bool = False, servers: Sequence[str] | None = None
    ) -> list[Reading]:
        """Every shard's clock, judged against its floor; with `write`, moved to `now_ms`
        and to its server in `servers` where it was found whole (or created where none
        was). Each reading names the server as it was before."""
        floors = [self.floor(shard) for shard in range(self.layout.count)]
        answers = self._beat(floors, now_ms, write=write, servers=servers)
        found = [reading(a) for a in answers]
        for shard, clock in enumerate(found):
            if clock.state is State.OK and clock.at_ms is not None:
                self._seen[shard] = max(self._seen.get(shard, clock.at_ms), clock.at_ms)
        self.last = found
        return found

    def oldest_ms(self) -> int | None:
        """The oldest clock the last look found among the shards, None where none had one."""
        times = [clock.at_ms for clock in self.last if clock.at_ms is not None]
        return min(times) if times else None

    def mark_lost(self, shards: Iterable[int], kind: str, now_ms: int, detail: str) -> None:
        """Leave the lost-data mark in `shards` ("<kind> <epoch ms> <detail>"): every process
        holds on it, and restarts hold again, until `restart` clears it."""
        text = f"{kind} {now_ms} {detail}"
        for shard in shards:
            self.client.hset(self.layout.shards[shard].clock, "lost", text)

    def mark_recheck(self, since_ms: int, until_ms: int) -> None:
        """Leave the recheck mark in every shard: an intake reads again what Redis lost since
        `since_ms`; until `until_ms`, each firer looks up what falls due there among what the
        target topics show delivered since then (firing/rechecks.py, claim.lua)."""
        for keys in self.layout.shards:
            self.client.hset(keys.clock, "recheck", f"{since_ms} {until_ms}")

    def restart(self, now_ms: int) -> None:
        """The operator acted (a rebuild, BLACKBOX_REDIS_LOSS=reread or skip): the marks go,
        every clock starts again from `now_ms`, and what this process saw before with it."""
        restart(self.client, self.layout, now_ms)
        self._seen = dict.fromkeys(range(self.layout.count), now_ms)


def restart(client: RedisClient, layout: Layout, now_ms: int) -> None:
    """Clear every shard's lost-data mark and set its clock to `now_ms` (`Clocks.restart`;
    a rebuild's last step)."""
    for keys in layout.shards:
        client.hdel(keys.clock, "lost")
        client.hset(keys.clock, "at", str(now_ms))


def refused_for_loss(error: Exception) -> bool:
    """Whether a claim was refused because its Redis lost data (claim.lua)."""
    return str(error).startswith(LOST_REFUSAL)

"""Every Redis key blackbox uses. Nothing else builds key names (the claim script joins
the prefixes `payload("")` and `ended("")` it is handed to the ids it takes).

Pending messages are spread over the shards of a `Layout`: a message's shard is a pure
function of its id, and every key of one shard shares that shard's hash tag, so each Lua
script touches a single slot and runs unchanged on Redis Cluster. With one shard (the
default) the tag is ``{namespace}``. With more, each shard's tag is chosen so that the
shards' slots spread evenly over the 16,384 slots of a cluster: a cluster whose masters
hold equal slot ranges (as `redis-cli --cluster create` makes them) gets an equal share of
shards on each master when the shard count is a multiple of the masters.

Names are short on purpose: a pending message costs one payload key and one sorted-set
member, and millions may be pending.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

# Joins a namespace to its shard's number in a shard's tag; namespaces may not contain it,
# so no namespace's tag is another's shard tag.
SHARD_SEPARATOR = "#"
# The most shards a namespace may have: choosing their tags costs about `shards` tries
# each at start, and more shards than this only add claim calls.
MAX_SHARDS = 1024
# The owned set (keys.owned) of the callers a policy does not list, which share one quota
# (quotas.py); no percent-encoded caller name is "*".
SHARED_OWNER = "*"


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one shard of a blackbox namespace (with one shard: all of them)."""

    namespace: str = "bb"
    # The shard's hash tag without braces; empty for the namespace itself (one shard).
    shard_tag: str = ""
    # Built once: payload() and ended() run once per message on the intake and firing paths.
    tag: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tag", "{" + (self.shard_tag or self.namespace) + "}")

    @property
    def due(self) -> str:
        """Sorted set: schedule id -> due time (epoch ms)."""
        return f"{self.tag}:due"

    @property
    def in_flight(self) -> str:
        """Sorted set: schedule id -> lease expiry (epoch ms) of the replica firing it."""
        return f"{self.tag}:fly"

    @property
    def attempts(self) -> str:
        """Hash: schedule id -> delivery attempts that failed or were interrupted."""
        return f"{self.tag}:try"

    @property
    def lease_counter(self) -> str:
        """String (INCR): counts the shard's claims, so each claim's lease token is its own."""
        return f"{self.tag}:lease"

    @property
    def intake_marks(self) -> str:
        """Hash: "topic:partition[:incarnation]" -> highest intake offset whose requests for
        this shard are handled (each shard keeps its own mark of every partition)."""
        return f"{self.tag}:in"

    @property
    def restate(self) -> str:
        """Sorted set: "<intake watermark field>|<id>" -> epoch ms intake stored a caller's
        id anew as it removed its ended-marker; the intake owning that partition writes
        what Redis holds of the id to the store topic again once firing's tombstone of its
        last version must have landed (intake/restating.py)."""
        return f"{self.tag}:restate"

    @property
    def clock(self) -> str:
        """Hash: "at", the epoch ms an intake last found this Redis whole; "lost", why Redis
        was found to have lost data, kept until the operator acts (clocks.py)."""
        return f"{self.tag}:clock"

    @property
    def owners(self) -> str:
        """Set: the callers (as in their ids: percent-encoded) with an `owned` set here."""
        return f"{self.tag}:owners"

    def owned(self, owner: str) -> str:
        """Sorted set: a caller's schedule ids in this shard -> due time (epoch ms), kept
        while a policy sets quotas; an id fired or ended lingers until pruned (quotas.py)."""
        return f"{self.tag}:own:{owner}"

    def nonce(self, caller: str, key_id: str, nonce: str) -> str:
        """String (SET ... NX EX): the intake record that used a signature's nonce first,
        kept while such a signature is accepted (see nonces.py)."""
        return f"{self.tag}:sig:{key_id}:{nonce}:{caller}"

    def payload(self, schedule_id: str) -> str:
        """String (SET ... EX): the encoded Schedule of one id. Kept short: one per message.

        Ids never start with ':' or '!', so these never meet the other names of the namespace."""
        return self.tag + schedule_id

    def ended(self, schedule_id: str) -> str:
        """String (SET ... EX): how a caller's id last ended, "f" fired or "c" cancelled.

        Kept for BLACKBOX_FIRED_RETENTION so a late cancel can answer already_fired."""
        return f"{self.tag}!{schedule_id}"


def shard_tag(namespace: str, shard: int, count: int) -> str:
    """The hash tag (without braces) of shard `shard` of `count`: the namespace itself for
    one shard; else the first of "ns#i", "ns#i#1", "ns#i#2"... whose slot falls in the
    i-th of `count` equal slot ranges. A pure function: every replica derives the same."""
    if count == 1:
        return namespace
    low = shard * REDIS_CLUSTER_HASH_SLOTS // count
    high = (shard + 1) * REDIS_CLUSTER_HASH_SLOTS // count
    attempt = 0
    while True:
        tag = f"{namespace}{SHARD_SEPARATOR}{shard}"
        if attempt:
            tag += f"{SHARD_SEPARATOR}{attempt}"
        if low <= key_slot(tag.encode("utf-8")) < high:
            return tag
        attempt += 1


@dataclass(frozen=True, slots=True)
class Layout:
    """The shards of one namespace, and the keys the whole namespace shares."""

    namespace: str = "bb"
    count: int = 1
    shards: tuple[Keys, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ValueError(f"shards must be 1..{MAX_SHARDS}, not {self.count}")
        shards = tuple(
            Keys(
                self.namespace, "" if self.count == 1 else shard_tag(self.namespace, i, self.count)
            )
            for i in range(self.count)
        )
        object.__setattr__(self, "shards", shards)

    def shard_of(self, schedule_id: str) -> int:
        """The shard holding `schedule_id`: a pure function of the id (CRC-32 of its UTF-8
        bytes, modulo the count), so an update or cancel finds it again."""
        if self.count == 1:
            return 0
        return zlib.crc32(schedule_id.encode("utf-8")) % self.count

    def keys_of(self, schedule_id: str) -> Keys:
        """The keys of the shard holding `schedule_id`."""
        return self.shards[self.shard_of(schedule_id)]

    @property
    def tag(self) -> str:
        """The namespace's own hash tag: the keys below live in its slot."""
        return "{" + self.namespace + "}"

    @property
    def shard_count(self) -> str:
        """String: the shard count the namespace's data was written with (see shardcount.py)."""
        return f"{self.tag}:shards"

    @property
    def refreshed_marks(self) -> str:
        """Hash: intake watermark field -> 1 once this release keeps every shard's mark of
        it within REFRESH_OFFSETS of the newest (watermarks.py). A field without it was
        written by a release that moved a shard's mark only with a request for that shard,
        so its lowest mark may lag any distance without anything lost."""
        return f"{self.tag}:inmarks"

    @property
    def store_filled(self) -> str:
        """String: the store topic that holds every schedule pending in this namespace
        (filled once, then kept by intake and firing: intake/filling.py)."""
        return f"{self.tag}:stored"

    @property
    def partition_counts(self) -> str:
        """Hash: intake topic -> every partition count its intake has seen ("3,4"): a signed
        keyed record sits on its key's partition under one of them (placement.py)."""
        return f"{self.tag}:parts"

    @property
    def intake_handling(self) -> str:
        """Hash: "topic:partition" -> "first last attempts", the intake offsets being handled
        (see crashguard.py); a note left behind is a handler that died."""
        return f"{self.tag}:handling"

    @property
    def incarnations(self) -> str:
        """Hash: intake topic -> "<looked-up tag> <tag in use>", the incarnation tag chosen
        for a topic whose offsets restarted under an unchanged topic id (incarnations.py)."""
        return f"{self.tag}:topics"

    @property
    def wake_channel(self) -> str:
        """Pub/sub channel: "shard:due ms", a due time sooner than replicas may have planned
        for."""
        return f"{self.tag}:wake"

    @property
    def processes(self) -> str:
        """Sorted set: process name -> expiry (epoch ms) of its last heartbeat, among every
        process running with the namespace's shard count, whatever its role (shardcount.py)."""
        return f"{self.tag}:procs"

    @property
    def members(self) -> str:
        """Sorted set: replica name -> expiry (epoch ms) of its last heartbeat, among the
        replicas that fire (see shares.py)."""
        return f"{self.tag}:firers"

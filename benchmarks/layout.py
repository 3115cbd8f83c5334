"""Redis layouts for index mode's pending references: Redis's bytes per pending schedule,
the claim's time and the lookup of an id's reference, layout by layout, on one redis-server
of its own with Redis's default settings.

    python -m benchmarks.layout [--pending 1000000 10000000] [--layouts today folded ...]
                                [--spreads day year] [--fill 90] [--claims 50]

For each size, spread and layout, on a redis-server started afresh (`--save ""
--appendonly no`; after a FLUSHALL Redis kept ~135 KB of buffers that the next fill
reused, so a delta read after one came out ~7 bytes a pending low at 20,000 pending):
`--pending` schedules with ids of 25 characters, due uniformly over a day (or a year) from
now, each with a reference of its real encoded size (reference.py: 28 bytes and the
caller's name, `--caller`, "bench" by default: 33 bytes), written by a Lua script per
layout, 500 pending a call, pipelined, as intake writes them. Printed per run (a JSON
line, then a table of every run):
- `bytes_per_pending`: `used_memory` (INFO memory) after the fill minus before, over the
  count: every key, set, index and allocator rounding the layout costs; and likewise, 15 s
  after the fill (jemalloc's dirty pages returned), `active_bytes_per_pending` from
  `allocator_active` (with the fragmentation of the allocator's slabs: listpacks that
  grow one entry at a time move up through its size classes) and `rss_bytes_per_pending`
  from `used_memory_rss`;
- `fill_us`: Redis's time (INFO commandstats) per pending written;
- `lookup_us`: Redis's time per id to find its reference by id (what an update or cancel
  does first), 2,000 random ids, 100 a call;
- `claim_us`: Redis's time per claim (INFO commandstats, `--claims` calls), a claim being a
  Lua script that takes the `--take` (200) earliest-due ids with their references and moves
  them to the in-flight sorted set `{bb}:fly` (its lease token the score); `claim_wall_us`
  the round trip seen by the client. Where a layout has two claims, the second runs after
  the first, on what the first left.

The layouts (B buckets, B = ceil(pending / --fill), an id's bucket `crc32(id) % B`, its
key's number in decimal; every key under the hash tag `{bb}`, so one slot on a cluster):

- `today`: what this release does. A string key `{bb}<id>` holding the reference, with EX
  (due plus an hour's grace), and the id in the due sorted set `{bb}:due`, scored by due
  epoch ms (a skiplist once past 128 members). Finds an id: GET its key.
- `hashed-refs`: the references in hash buckets `{bb}:r:<bucket>` (id -> reference), the due
  set unchanged. Finds an id: HGET in its bucket (the caller computes the bucket). The claim
  computes each taken id's bucket in Lua (CRC-32 from a table).
- `bucketed`: per bucket a sorted set `{bb}:z:<bucket>` (id -> due) and a hash `{bb}:r:<bucket>`
  (id -> reference), both small enough to stay listpacks, and a top-level sorted set
  `{bb}:due` of bucket -> its earliest due. Finds an id: HGET (and ZSCORE) in its bucket.
- `folded`: as `bucketed` without the hash: the bucket's sorted set holds one member per
  pending, a byte of the id's length, the id, then its reference (59 bytes here), scored
  by due. Finds an id: a scan of its bucket's members (at most ~128) for the one that
  starts with length and id (ZSCAN with MATCH, see _FIND).
- `folded-lean`: as `folded`, with the reference's 8 bytes of due time left out of the
  member (the score holds it; a claim or lookup puts them back): 51 bytes here.
- `timed`: per due-time slot (W ms wide, W = a day * --fill / pending: slots of --fill
  schedules when due over a day) a sorted set `{bb}:t:<slot>` of members as `folded`'s, a
  top-level sorted set `{bb}:due` of slot -> earliest due, and an id index in hash buckets
  `{bb}:i:<bucket>` (id -> slot). Finds an id: HGET its slot, then scan the slot. Its
  weakness: W is fixed for a density; due over a year, the same W leaves most slots with
  one schedule, a key of its own each (the `year` runs show the cost).

The claims of the bucketed layouts keep `{bb}:due` exact after taking ids out: each bucket
taken from is re-scored by its new earliest due (or removed once empty). Both take ids in
due order across buckets.
- `strict`: one id at a time: ZRANGE the top set's first bucket, ZPOPMIN it, ZRANGE the
  bucket's new first, ZADD (or ZREM) the top set: four calls an id.
- `merge`: one ZRANGE of the top set's `--take` earliest buckets due, merged in Lua: the
  earliest candidate's bucket is popped (ZPOPMIN, ZRANGE its new first) and goes back
  among the candidates while its next due is no later than the last bucket fetched (none
  left out starts earlier); the buckets taken from are re-scored in one ZADD at the end:
  two calls an id.

A bucket past 128 entries, or holding a value over 64 bytes (hash-max-listpack-value,
zset-max-listpack-value: a long id or caller name), is converted by Redis to a hash table
or skiplist: every operation stays correct, the bucket costs more than twice as much per
entry (`folded` with an 18-character caller, every member 72 bytes: 189 bytes a pending
and 101 µs a lookup at a million), and Redis 7.0 never converts it back. `overflowed`
counts the buckets (or slots) filled past 128 (zset-max-listpack-entries; hashed-refs':
past hash-max-listpack-entries, 512 in Redis 7.0). The cost of a bucket's linear scan
grows with --fill; B must be chosen for the most pending expected (fixed for a namespace:
changing it moves every entry), and a bucket costs ~290 bytes whatever it holds (derived
from `folded` at a million: 79.0 bytes a pending with 90 a bucket, 85.4 with 30).

Measured (2 cores, Redis 7.0.15, other benchmarks running beside: the µs are noisy, the
bytes are not): `today` 302.6 bytes a pending at a million, 331.1 at ten million; `folded`
79.0 and 78.8 (allocator_active 94 and 93, RSS 96 and 94), `folded-lean` 70.8 and 70.6,
`bucketed` 111.0, `timed` 116.1 over a day and 294.2 over a year. Claims of 200: `today`
1.4-2.2 ms, `folded` 1.9-2.7 ms; a lookup by id: `today` 3-8 µs, `folded` 17-28 µs.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from benchmarks.stack import redis_for
from blackbox.reference import Reference

DAY_MS = 86_400_000
SPREADS = {"day": DAY_MS, "year": 365 * DAY_MS}
ID_CHARS = 25
GRACE_S = 3600  # today's payload keys expire this long after their due time
PER_CALL = 500  # pending written per fill call
CALLS_PER_PIPELINE = 8
SETTLE_S = 1.0  # waited before reading used_memory
# Waited after the fill before reading the allocator's and the process's memory: jemalloc
# returns freed pages after its dirty_decay_ms (10 s).
RSS_SETTLE_S = 15.0
LOOKUPS = 2000
LOOKUPS_PER_CALL = 100
TAG = "{bb}"
DUE = TAG + ":due"  # today, hashed-refs: id -> due; the others: bucket (slot) -> earliest due
FLY = TAG + ":fly"
ZSETS, HASHES, SLOTS, INDEX = TAG + ":z:", TAG + ":r:", TAG + ":t:", TAG + ":i:"
DUE_AT = slice(1, 9)  # a reference's due time, big-endian i64 (reference.py)

# Taking ids: `lease` is the in-flight score. Returns {ids or members taken, references (or
# false: in the member), dues, the earliest due left or false}.
_LEASE = """
local taken, refs, dues, leased = {}, {}, {}, {}
local function take(member, ref, due)
  taken[#taken + 1] = member
  refs[#refs + 1] = ref
  dues[#dues + 1] = due
  leased[#leased + 1] = ARGV[3]
  leased[#leased + 1] = member
end
local function lease()
  if #leased > 0 then
    redis.call('ZADD', KEYS[2], unpack(leased))
  end
end
"""

# KEYS[1] due set, ARGV[1] payload key prefix, [2] now ms, [3] grace s; per pending: id, due,
# reference.
FILL_TODAY = """
local now, grace = tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV, 3 do
  local id, due = ARGV[i], ARGV[i + 1]
  local ttl = math.ceil((tonumber(due) - now) / 1000) + grace
  redis.call('SET', ARGV[1] .. id, ARGV[i + 2], 'EX', ttl)
  redis.call('ZADD', KEYS[1], due, id)
end
return 0
"""

# KEYS[1] due set, ARGV[1] hash prefix; per pending: id, due, reference, bucket.
FILL_HASHED = """
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  redis.call('HSET', ARGV[1] .. ARGV[i + 3], id, ARGV[i + 2])
  redis.call('ZADD', KEYS[1], ARGV[i + 1], id)
end
return 0
"""

# KEYS[1] top set, ARGV[1] bucket sorted-set prefix, [2] hash prefix; per pending: id, due,
# reference, bucket.
FILL_BUCKETED = """
for i = 3, #ARGV, 4 do
  local id, due, bucket = ARGV[i], ARGV[i + 1], ARGV[i + 3]
  redis.call('HSET', ARGV[2] .. bucket, id, ARGV[i + 2])
  redis.call('ZADD', ARGV[1] .. bucket, due, id)
  redis.call('ZADD', KEYS[1], 'LT', due, bucket)
end
return 0
"""

# KEYS[1] top set, ARGV[1] bucket prefix; per pending: member, due, bucket.
FILL_FOLDED = """
for i = 2, #ARGV, 3 do
  local due, bucket = ARGV[i + 1], ARGV[i + 2]
  redis.call('ZADD', ARGV[1] .. bucket, due, ARGV[i])
  redis.call('ZADD', KEYS[1], 'LT', due, bucket)
end
return 0
"""

# KEYS[1] top set, ARGV[1] slot prefix, [2] index prefix, [3] slot width ms; per pending: id,
# due, member, index bucket.
FILL_TIMED = """
local width = tonumber(ARGV[3])
for i = 4, #ARGV, 4 do
  local due = ARGV[i + 1]
  local slot = string.format('%d', math.floor(tonumber(due) / width))
  redis.call('ZADD', ARGV[1] .. slot, due, ARGV[i + 2])
  redis.call('HSET', ARGV[2] .. ARGV[i + 3], ARGV[i], slot)
  redis.call('ZADD', KEYS[1], 'LT', due, slot)
end
return 0
"""

# Finding an id's entry in a bucket's sorted set of members (length byte, id, reference):
# ZSCAN with a MATCH of that prefix, glob characters escaped, compared in C. A listpack
# bucket answers whole in one call; a converted one (a skiplist) takes the cursor's rounds.
_FIND = """
local function find(key, id)
  local pattern = string.gsub(string.char(#id) .. id, '[%*%?%[%]\\\\]', '\\\\%0') .. '*'
  local cursor = '0'
  repeat
    local page = redis.call('ZSCAN', key, cursor, 'MATCH', pattern, 'COUNT', 1000)
    if page[2][1] then
      return page[2][1]
    end
    cursor = page[1]
  until cursor == '0'
  return false
end
"""


# Lookups: ARGV[1], [2] prefixes; per id: id, bucket. Returns what was found per id.
LOOKUP_TODAY = """
local found = {}
for i = 3, #ARGV, 2 do
  found[#found + 1] = redis.call('GET', ARGV[1] .. ARGV[i])
end
return found
"""

LOOKUP_HASHED = """
local found = {}
for i = 3, #ARGV, 2 do
  found[#found + 1] = redis.call('HGET', ARGV[1] .. ARGV[i + 1], ARGV[i])
end
return found
"""

LOOKUP_FOLDED = (
    _FIND
    + """
local found = {}
for i = 3, #ARGV, 2 do
  found[#found + 1] = find(ARGV[1] .. ARGV[i + 1], ARGV[i])
end
return found
"""
)

LOOKUP_TIMED = (
    _FIND
    + """
local found = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local slot = redis.call('HGET', ARGV[2] .. ARGV[i + 1], id)
  found[#found + 1] = slot and find(ARGV[1] .. slot, id)
end
return found
"""
)

# Claims: KEYS[1] due (top) set, KEYS[2] in-flight set; ARGV[1] due by ms, [2] the most ids,
# [3] lease (in-flight score), then the layout's prefixes.
CLAIM_TODAY = (
    _LEASE
    + """
local ids = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2],
                       'WITHSCORES')
for i = 1, #ids, 2 do
  take(ids[i], redis.call('GET', ARGV[4] .. ids[i]), ids[i + 1])
end
lease()
if #taken > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #taken - 1)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {taken, refs, dues, first[2] or false}
"""
)


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    return table


# ARGV[4] hash prefix, [5] bucket count. CRC-32 as zlib.crc32 computes it (LuaBitOp's
# results are signed 32-bit).
CLAIM_HASHED = (
    _LEASE
    + "local CRC = {"
    + ",".join(map(str, _crc_table()))
    + """}
local band, bxor, rshift, bnot, byte = bit.band, bit.bxor, bit.rshift, bit.bnot, string.byte
local count = tonumber(ARGV[5])
local function bucket(id)
  local c = -1
  for i = 1, #id do
    c = bxor(rshift(c, 8), CRC[band(bxor(c, byte(id, i)), 255) + 1])
  end
  c = bnot(c)
  if c < 0 then
    c = c + 4294967296
  end
  return string.format('%d', c % count)
end
local ids = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2],
                       'WITHSCORES')
for i = 1, #ids, 2 do
  take(ids[i], redis.call('HGET', ARGV[4] .. bucket(ids[i]), ids[i]), ids[i + 1])
end
lease()
if #taken > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #taken - 1)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {taken, refs, dues, first[2] or false}
"""
)

# ARGV[4] bucket sorted-set prefix, [5] hash prefix ('' when the reference is in the member).
_BUCKET_POP = """
local zsets, hashes = ARGV[4], ARGV[5]
-- Take the earliest of `bucket`; answers its next earliest due, or nil once empty.
local function pop(bucket)
  local popped = redis.call('ZPOPMIN', zsets .. bucket)
  if popped[1] then
    take(popped[1], hashes ~= '' and redis.call('HGET', hashes .. bucket, popped[1]), popped[2])
  end
  return redis.call('ZRANGE', zsets .. bucket, 0, 0, 'WITHSCORES')[2]
end
"""

CLAIM_BUCKETED_STRICT = (
    _LEASE
    + _BUCKET_POP
    + """
local due_by, most = tonumber(ARGV[1]), tonumber(ARGV[2])
while #taken < most do
  local top = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if not top[1] or tonumber(top[2]) > due_by then
    break
  end
  local next_due = pop(top[1])
  if next_due then
    redis.call('ZADD', KEYS[1], next_due, top[1])
  else
    redis.call('ZREM', KEYS[1], top[1])
  end
end
lease()
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {taken, refs, dues, first[2] or false}
"""
)

# The `--take` earliest buckets due, from one ZRANGE, merged: the earliest candidate is
# taken from, and its bucket goes back among the candidates if its next due is within
# `bound` (no bucket left out of the ZRANGE starts before it), else is re-scored at the end.
CLAIM_BUCKETED_MERGE = (
    _LEASE
    + _BUCKET_POP
    + """
local most = tonumber(ARGV[2])
local tops = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, most,
                        'WITHSCORES')
local buckets, raws, scores = {}, {}, {}
for i = 1, #tops, 2 do
  buckets[#buckets + 1], raws[#raws + 1], scores[#scores + 1] = tops[i], tops[i + 1],
    tonumber(tops[i + 1])
end
local bound = #buckets < most and tonumber(ARGV[1]) or scores[#scores]
local rescored, emptied, touched = {}, {}, {}
local first = 1
while #taken < most and first <= #buckets do
  local bucket = buckets[first]
  first = first + 1
  touched[bucket] = true
  local next_due = pop(bucket)
  if not next_due then
    emptied[#emptied + 1] = bucket
  elseif tonumber(next_due) <= bound then
    local due, low, high = tonumber(next_due), first, #buckets + 1
    while low < high do  -- the first candidate due after it
      local mid = math.floor((low + high) / 2)
      if scores[mid] > due then
        high = mid
      else
        low = mid + 1
      end
    end
    table.insert(buckets, low, bucket)
    table.insert(raws, low, next_due)
    table.insert(scores, low, due)
  else
    rescored[#rescored + 1] = next_due
    rescored[#rescored + 1] = bucket
  end
end
for i = first, #buckets do
  if touched[buckets[i]] then
    rescored[#rescored + 1] = raws[i]
    rescored[#rescored + 1] = buckets[i]
  end
end
if #rescored > 0 then
  redis.call('ZADD', KEYS[1], unpack(rescored))
end
if #emptied > 0 then
  redis.call('ZREM', KEYS[1], unpack(emptied))
end
lease()
local first_left = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {taken, refs, dues, first_left[2] or false}
"""
)

# ARGV[4] slot prefix. The index entries (id -> slot) stay until the ack, as today's
# payload keys do.
CLAIM_TIMED = (
    _LEASE
    + """
local due_by, most = tonumber(ARGV[1]), tonumber(ARGV[2])
while #taken < most do
  local top = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if not top[1] or tonumber(top[2]) > due_by then
    break
  end
  local slot = ARGV[4] .. top[1]
  local got = redis.call('ZRANGE', slot, '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0,
                         most - #taken, 'WITHSCORES')
  for i = 1, #got, 2 do
    take(got[i], false, got[i + 1])
  end
  if #got > 0 then
    redis.call('ZREMRANGEBYRANK', slot, 0, #got / 2 - 1)
  end
  local next_due = redis.call('ZRANGE', slot, 0, 0, 'WITHSCORES')[2]
  if next_due then
    redis.call('ZADD', KEYS[1], next_due, top[1])
  else
    redis.call('ZREM', KEYS[1], top[1])
  end
end
lease()
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {taken, refs, dues, first[2] or false}
"""
)


@dataclass(frozen=True)
class Plan:
    """One run's shape: the bucket count and a time slot's width."""

    pending: int
    buckets: int
    slot_ms: int
    now_ms: int


def folded_member(schedule_id: str, ref: bytes) -> bytes:
    """`folded`'s member: the id's length in a byte, the id, its reference."""
    raw = schedule_id.encode("utf-8")
    return bytes([len(raw)]) + raw + ref


def lean_member(schedule_id: str, ref: bytes) -> bytes:
    """`folded-lean`'s member: as `folded`'s, the reference's due time left out."""
    return folded_member(schedule_id, ref[: DUE_AT.start] + ref[DUE_AT.stop :])


Record = Callable[[str, int, bytes, int], list[Any]]
Head = Callable[[Plan], list[Any]]


@dataclass(frozen=True)
class Layout:
    """A candidate layout: its scripts and the arguments each takes."""

    fill: str
    fill_head: Head
    record: Record  # (id, due ms, reference, bucket) -> one pending's fill arguments
    lookup: str
    lookup_head: Head
    claims: dict[str, str]
    claim_head: Head
    finds: str  # how an update or cancel finds an id's entry


LAYOUTS: dict[str, Layout] = {
    "today": Layout(
        FILL_TODAY, lambda p: [TAG, p.now_ms, GRACE_S], lambda i, d, r, _b: [i, d, r],
        LOOKUP_TODAY, lambda _p: [TAG, ""], {"claim": CLAIM_TODAY}, lambda _p: [TAG],
        "GET {bb}<id>; ZREM {bb}:due id",
    ),
    "hashed-refs": Layout(
        FILL_HASHED, lambda _p: [HASHES], lambda i, d, r, b: [i, d, r, b],
        LOOKUP_HASHED, lambda _p: [HASHES, ""], {"claim": CLAIM_HASHED},
        lambda p: [HASHES, p.buckets], "HGET {bb}:r:<bucket> id; ZREM {bb}:due id",
    ),
    "bucketed": Layout(
        FILL_BUCKETED, lambda _p: [ZSETS, HASHES], lambda i, d, r, b: [i, d, r, b],
        LOOKUP_HASHED, lambda _p: [HASHES, ""],
        {"strict": CLAIM_BUCKETED_STRICT, "merge": CLAIM_BUCKETED_MERGE},
        lambda _p: [ZSETS, HASHES],
        "HGET {bb}:r:<bucket> id; ZREM {bb}:z:<bucket> id; re-score the bucket in {bb}:due",
    ),
    "folded": Layout(
        FILL_FOLDED, lambda _p: [ZSETS], lambda i, d, r, b: [folded_member(i, r), d, b],
        LOOKUP_FOLDED, lambda _p: [ZSETS, ""],
        {"strict": CLAIM_BUCKETED_STRICT, "merge": CLAIM_BUCKETED_MERGE},
        lambda _p: [ZSETS, ""],
        "scan {bb}:z:<bucket> for the member starting with len+id; ZREM it; re-score",
    ),
    "folded-lean": Layout(
        FILL_FOLDED, lambda _p: [ZSETS], lambda i, d, r, b: [lean_member(i, r), d, b],
        LOOKUP_FOLDED, lambda _p: [ZSETS, ""],
        {"strict": CLAIM_BUCKETED_STRICT, "merge": CLAIM_BUCKETED_MERGE},
        lambda _p: [ZSETS, ""],
        "as folded (the due time from the member's score)",
    ),
    "timed": Layout(
        FILL_TIMED, lambda p: [SLOTS, INDEX, p.slot_ms],
        lambda i, d, r, b: [i, d, folded_member(i, r), b],
        LOOKUP_TIMED, lambda _p: [SLOTS, INDEX], {"claim": CLAIM_TIMED}, lambda _p: [SLOTS],
        "HGET {bb}:i:<bucket> id -> slot; scan {bb}:t:<slot>; ZREM; HDEL; re-score the slot",
    ),
}  # fmt: skip


def schedule_id(n: int) -> str:
    """The n-th id: 25 hex digits, distinct for every n (an odd multiplier mod 16**25)."""
    return f"{(n * 0x9E3779B97F4A7C15F39CC0605 + 0x1234567) % 16**ID_CHARS:025x}"


def reference(n: int, due_ms: int, caller: bytes | None) -> bytes:
    return Reference(due_ms, n % 12, 1_000_000 + n, 200 + n % 300, caller).encode()


def bucket_of(schedule_id: str, buckets: int) -> int:
    return zlib.crc32(schedule_id.encode("utf-8")) % buckets


def _memory(client: redis.Redis) -> tuple[int, int, int]:
    """`used_memory`, `allocator_active` and `used_memory_rss`."""
    info = client.info("memory")
    return int(info["used_memory"]), int(info["allocator_active"]), int(info["used_memory_rss"])


def _script_usec(client: redis.Redis) -> tuple[int, int]:
    """(calls, µs) of EVALSHA since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(stats["calls"]), int(stats["usec"])


def fill(url: str, layout: Layout, plan: Plan, spread_ms: int, caller: bytes | None) -> list[int]:
    """Write `plan.pending` schedules; answers how many fell in each bucket (or slot)."""
    client = redis.Redis.from_url(url)  # its own connection, closed before memory is read
    sha = client.script_load(layout.fill)
    head = layout.fill_head(plan)
    rng = random.Random(plan.pending)  # the same dues for every layout of one size
    counts = [0] * plan.buckets
    timed = layout.fill == FILL_TIMED
    slots: dict[int, int] = {}
    pipe = client.pipeline(transaction=False)
    batch: list[Any] = []
    calls = 0
    for n in range(plan.pending):
        sid = schedule_id(n)
        due = plan.now_ms + 1000 + int(rng.random() * spread_ms)
        bucket = bucket_of(sid, plan.buckets)
        counts[bucket] += 1
        if timed:
            slots[due // plan.slot_ms] = slots.get(due // plan.slot_ms, 0) + 1
        batch += layout.record(sid, due, reference(n, due, caller), bucket)
        if (n + 1) % PER_CALL == 0 or n + 1 == plan.pending:
            pipe.evalsha(sha, 1, DUE, *head, *batch)
            batch = []
            calls += 1
            if calls % CALLS_PER_PIPELINE == 0 or n + 1 == plan.pending:
                pipe.execute()
    client.close()
    return list(slots.values()) if timed else counts


def lookups(client: redis.Redis, layout: Layout, plan: Plan) -> tuple[float, int]:
    """Redis's µs per id found by id, and how many of LOOKUPS were found."""
    sha = client.script_load(layout.lookup)
    rng = random.Random(1)
    wanted = [schedule_id(rng.randrange(plan.pending)) for _ in range(LOOKUPS)]
    client.config_resetstat()
    found = 0
    for start in range(0, LOOKUPS, LOOKUPS_PER_CALL):
        args = [a for sid in wanted[start : start + LOOKUPS_PER_CALL]
                for a in (sid, bucket_of(sid, plan.buckets))]  # fmt: skip
        found += sum(1 for f in client.evalsha(sha, 0, *layout.lookup_head(plan), *args) if f)
    _, usec = _script_usec(client)
    return usec / LOOKUPS, found


def claims(
    client: redis.Redis, script: str, head: list[Any], count: int, take: int
) -> dict[str, Any]:
    """`count` claims of `take` ids each: Redis's and the client's µs per claim, the ids
    taken and the references answered beside them (none where the member holds it), and
    whether the dues came out in order across them all."""
    sha = client.script_load(script)
    client.config_resetstat()
    walls, dues, taken, refs = [], [], 0, 0
    for n in range(count):
        started = time.perf_counter()
        ids, found, got, _first = client.evalsha(sha, 2, DUE, FLY, 2**53, take, n, *head)
        walls.append(time.perf_counter() - started)
        taken += len(ids)
        refs += sum(1 for ref in found if ref is not None)
        dues += [float(d) for d in got]
    calls, usec = _script_usec(client)
    return {"us": round(usec / calls, 1), "wall_us": round(statistics.median(walls) * 1e6, 1),
            "taken": taken, "refs": refs, "in_order": dues == sorted(dues)}  # fmt: skip


def one_run(  # noqa: PLR0913 - one run's parameters, each named
    url: str, name: str, pending: int, spread: str, fill_per_bucket: int, *,
    claim_count: int, take: int, caller: bytes | None,
) -> dict[str, Any]:  # fmt: skip
    layout = LAYOUTS[name]
    control = redis.Redis.from_url(url)
    slot_ms = max(1, math.ceil(DAY_MS * fill_per_bucket / pending))
    plan = Plan(pending, math.ceil(pending / fill_per_bucket), slot_ms, int(time.time() * 1000))
    limits = {k: int(v or 0) for k, v in control.config_get("*-max-listpack-*").items() if k}
    # The buckets' binding limit: their sorted sets' (the hashes' is 512 by default).
    kind = "hash" if name == "hashed-refs" else "zset"
    limit = limits[f"{kind}-max-listpack-entries"]
    control.script_load(layout.fill)
    time.sleep(SETTLE_S / 2)
    before = _memory(control)
    control.config_resetstat()
    started = time.monotonic()
    counts = fill(url, layout, plan, SPREADS[spread], caller)
    filled_at = time.monotonic()
    filled_s = filled_at - started
    _, fill_usec = _script_usec(control)
    time.sleep(SETTLE_S)  # the fill connection's buffers gone
    used = _memory(control)[0] - before[0]
    keys = int(control.dbsize())
    lookup_us, found = lookups(control, layout, plan)
    time.sleep(max(0.0, filled_at + RSS_SETTLE_S - time.monotonic()))
    _, active, rss = (after - first for after, first in zip(_memory(control), before, strict=True))
    result: dict[str, Any] = {
        "layout": name, "pending": pending, "spread": spread, "id_chars": ID_CHARS,
        "reference_bytes": len(reference(0, plan.now_ms, caller)),
        "buckets": plan.buckets if name not in ("today", "timed") else None,
        "slot_ms": slot_ms if name == "timed" else None,
        "index_buckets": plan.buckets if name == "timed" else None,
        "keys": keys, "bytes_per_pending": round(used / pending, 1),
        "active_bytes_per_pending": round(active / pending, 1),
        "rss_bytes_per_pending": round(rss / pending, 1),
        "gb_at_100m": round(used / pending * 1e8 / 1e9, 2),
        "overflowed": sum(1 for c in counts if c > limit) if name != "today" else None,
        "largest": max(counts) if name != "today" else None,
        "filled_in_s": round(filled_s, 1), "fill_us": round(fill_usec / pending, 2),
        "lookup_us": round(lookup_us, 2), "lookups_found": found, "redis_config": limits,
    }  # fmt: skip
    for variant, script in layout.claims.items():
        got = claims(control, script, layout.claim_head(plan), claim_count, take)
        result.update({f"{variant}_{k}": v for k, v in got.items()})
    control.close()
    return result


def _claim_cell(result: dict[str, Any], variant: str) -> str:
    if f"{variant}_us" not in result:
        return ""
    order = "" if result[f"{variant}_in_order"] else " *"
    return f"{result[f'{variant}_us']:.0f} ({result[f'{variant}_wall_us']:.0f}){order}"


def table(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        f"{'layout':<12} {'spread':<5} {'pending':>10} {'keys':>10} {'B/pending':>9} "
        f"{'active':>6} {'RSS':>5} "
        f"{'GB@100M':>7} {'fill µs':>7} {'lookup µs':>9} {'overflow':>8}  "
        f"{'claim µs (wall)':<16} {'strict µs':<14} {'merge µs':<14}"
    ]
    for r in results:
        lines.append(
            f"{r['layout']:<12} {r['spread']:<5} {r['pending']:>10,} {r['keys']:>10,} "
            f"{r['bytes_per_pending']:>9.1f} {r['active_bytes_per_pending']:>6.0f} "
            f"{r['rss_bytes_per_pending']:>5.0f} {r['gb_at_100m']:>7.2f} {r['fill_us']:>7.2f} "
            f"{r['lookup_us']:>9.2f} {r['overflowed'] if r['overflowed'] is not None else '':>8}  "
            f"{_claim_cell(r, 'claim'):<16} {_claim_cell(r, 'strict'):<14} "
            f"{_claim_cell(r, 'merge'):<14}"
        )
    lines.append("claims: Redis µs per claim (client round trip, median); * ids not in due "
                 "order across the claims")  # fmt: skip
    lines += [f"  {name}: finds an id by {LAYOUTS[name].finds}"
              for name in dict.fromkeys(r["layout"] for r in results)]  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pending", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--spreads", nargs="+", default=list(SPREADS), choices=list(SPREADS))
    parser.add_argument("--fill", type=int, default=90, help="pending per bucket, on average")
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--take", type=int, default=200, help="ids per claim")
    parser.add_argument("--caller", default="bench", help="the caller's name in each reference")
    args = parser.parse_args(argv)
    print(f"# python -m benchmarks.layout --pending {' '.join(map(str, args.pending))} "  # noqa: T201
          f"--layouts {' '.join(args.layouts)} --spreads {' '.join(args.spreads)} "
          f"--fill {args.fill} --claims {args.claims} --take {args.take} "
          f"--caller '{args.caller}'", flush=True)  # fmt: skip
    caller = args.caller.encode("utf-8") or None
    results = []
    for pending in args.pending:
        for spread in args.spreads:
            for name in args.layouts:
                with redis_for("single") as url:
                    result = one_run(url, name, pending, spread, args.fill,
                                     claim_count=args.claims, take=args.take,
                                     caller=caller)  # fmt: skip
                results.append(result)
                print(orjson.dumps(result).decode(), flush=True)  # noqa: T201 - figures
    print(table(results), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!lua flags=allow-oom
-- Move due ids into the in-flight set under a lease and read what firing them needs, in
-- one atomic step (one round trip per batch fired).
--
-- Runs on a Redis over `maxmemory` (allow-oom): it moves ids between the two sets, memory
-- stays level, and firing is what frees a full Redis.
--
-- KEYS[1]  due sorted set (id -> due epoch ms)
-- KEYS[2]  in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[3]  attempts hash (id -> failed attempts)
-- KEYS[4]  lease counter (string, INCR): makes each claim's lease token its own
-- ARGV[1]  due by, epoch ms: ids due at or before it are taken
-- ARGV[2]  the most ids to take
-- ARGV[3]  lease expiry, epoch ms (the claim's instant plus the lease)
-- ARGV[4]  payload key prefix: an id's payload key is this followed by the id
-- ARGV[5]  ended-marker key prefix, likewise (read for caller ids, '@...', only)
-- ARGV[6]  the most payload bytes to take (a reference counts its record's size); the
--          first id is taken whatever its size
-- ARGV[7]  "1": answer the shard's earliest lease expiry too (one more read; asked now
--          and then, not at every claim)
-- KEYS[5]  the shard's clock hash (beat.lua)
-- ARGV[8]  the clock's floor, epoch ms (-1: none): nothing is claimed from a Redis whose
--          clock is missing or below it, or that holds a lost-data mark (it was flushed,
--          or restored from an older snapshot: what it holds may have fired already)
--
-- Returns: {ids taken (earliest due first), due time of the earliest id left or false,
-- and per id taken: its payload (false once expired), its failed attempts (false for
-- none), its ended marker (false for none); then the lease token, as text; then, if
-- asked, the earliest lease expiry in the shard (this claim's or anyone's), else false:
-- the claimer reclaims the shard only once that can have run out; then the clock's
-- recheck mark, "<since ms> <until ms>", or false: an operator's re-read of lost data is
-- under way, and what the target topics show delivered since then is not delivered again
-- (clocks.py, firing/rechecks.py); then the clock's time and server, or false: a claim
-- made on another server than the clock's (a restart, a failover, a restored snapshot)
-- is rechecked from the clock's time on}.
-- The lease token is the lease expiry plus a fraction of a millisecond (n/1024, exact in
-- a double until the year 2248) that no other claim of this shard within 1,024 claims has:
-- two claims in one millisecond never share a token, and the in-flight score stays the
-- lease expiry to the millisecond.
-- The payload and marker keys are not declared in KEYS (which ids are due is known only
-- here), but their names carry the namespace's hash tag: one slot, as on Redis Cluster.
-- Invariant: two claimers never receive the same id while its lease runs. (An id updated
-- while in flight is in both sets: its new version is due. Claiming it again moves the
-- lease to the new claimer; the old one's ack then finds its lease lost.)
local clock = redis.call('HMGET', KEYS[5], 'at', 'lost', 'recheck', 'server')
local floor = tonumber(ARGV[8])
if clock[2] or (floor >= 0 and (not clock[1] or tonumber(clock[1]) < floor)) then
  return redis.error_reply('BLACKBOX_LOST ' .. (clock[2] or (clock[1] and 'restored' or 'flushed')) ..
    ': Redis lost data; nothing is claimed until the operator acts')
end
local ids = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
local payloads, attempts, ended = {}, {}, {}
local budget = tonumber(ARGV[6])
local taken = 0
for i, id in ipairs(ids) do
  local payload = redis.call('GET', ARGV[4] .. id)
  local size = payload and #payload or 0
  if size >= 26 and string.byte(payload, 1) == 3 then
    -- Index mode's reference (reference.py): the record it names counts, bytes 23 to 26.
    local a, b, c, d = string.byte(payload, 23, 26)
    size = ((a * 256 + b) * 256 + c) * 256 + d
  end
  if taken > 0 and size > budget then
    break
  end
  budget = budget - size
  payloads[i] = payload
  taken = i
end
local token = tonumber(ARGV[3])
local claimed = {}
if taken > 0 then
  token = token + (redis.call('INCR', KEYS[4]) % 1024) / 1024
  -- Attempts are recorded only after a failure: usually the hash is empty.
  local tracked = redis.call('HLEN', KEYS[3]) > 0
  -- One ZADD per 1,000 ids rather than one per id (a fifth less time per claim of 1,000);
  -- in chunks, as unpack() takes at most about 8,000 values.
  for from = 1, taken, 1000 do
    local leased = {}
    for i = from, math.min(from + 999, taken) do
      leased[#leased + 1] = token
      leased[#leased + 1] = ids[i]
    end
    redis.call('ZADD', KEYS[2], unpack(leased))
  end
  for i = 1, taken do
    local id = ids[i]
    claimed[i] = id
    attempts[i] = tracked and redis.call('HGET', KEYS[3], id)
    ended[i] = string.sub(id, 1, 1) == '@' and redis.call('GET', ARGV[5] .. id)
  end
  -- The ids taken are exactly the lowest ranks of the due set.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, taken - 1)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local lease = ARGV[7] == '1' and redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES') or {}
return {claimed, first[2] or false, payloads, attempts, ended, string.format('%.17g', token),
        lease[2] or false, clock[3] or false, clock[1] or false, clock[4] or false}

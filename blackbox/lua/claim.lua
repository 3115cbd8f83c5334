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
-- ARGV[1]  now, epoch ms: ids due at or before it are taken
-- ARGV[2]  the most ids to take
-- ARGV[3]  lease expiry, epoch ms; also the token the claimer acks with
-- ARGV[4]  payload key prefix: an id's payload key is this followed by the id
-- ARGV[5]  ended-marker key prefix, likewise (read for caller ids, '@...', only)
--
-- Returns: {ids taken (earliest due first), due time of the earliest id left or false,
-- and per id taken: its payload (false once expired), its failed attempts (false for
-- none), its ended marker (false for none)}.
-- The payload and marker keys are not declared in KEYS (which ids are due is known only
-- here), but their names carry the namespace's hash tag: one slot, as on Redis Cluster.
-- Invariant: two claimers never receive the same id while its lease runs. (An id updated
-- while in flight is in both sets: its new version is due. Claiming it again moves the
-- lease to the new claimer; the old one's ack then finds its lease lost.)
local ids = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
local payloads, attempts, ended = {}, {}, {}
if #ids > 0 then
  -- Attempts are recorded only after a failure: usually the hash is empty.
  local tracked = redis.call('HLEN', KEYS[3]) > 0
  -- One ZADD per 1,000 ids rather than one per id (a fifth less time per claim of 1,000);
  -- in chunks, as unpack() takes at most about 8,000 values.
  for from = 1, #ids, 1000 do
    local leased = {}
    for i = from, math.min(from + 999, #ids) do
      leased[#leased + 1] = ARGV[3]
      leased[#leased + 1] = ids[i]
    end
    redis.call('ZADD', KEYS[2], unpack(leased))
  end
  for i, id in ipairs(ids) do
    payloads[i] = redis.call('GET', ARGV[4] .. id)
    attempts[i] = tracked and redis.call('HGET', KEYS[3], id)
    ended[i] = string.sub(id, 1, 1) == '@' and redis.call('GET', ARGV[5] .. id)
  end
  -- The ids taken are exactly the lowest ranks of the due set.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #ids - 1)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {ids, first[2] or false, payloads, attempts, ended}

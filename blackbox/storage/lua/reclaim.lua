#!lua flags=allow-oom
-- Return in-flight ids whose lease expired (their replica died or stalled) to the due set.
--
-- Runs on a Redis over `maxmemory` (allow-oom): it moves ids back to due (an attempts field
-- is the only growth), so the leases of a dead replica return on a full Redis too.
--
-- KEYS[1]  in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[2]  due sorted set (id -> due epoch ms)
-- KEYS[3]  attempts hash (id -> failed attempts)
-- ARGV[1]  now, epoch ms: leases that ended at or before it are expired
-- ARGV[2]  the most ids to return
--
-- Returns: {how many ids were returned, the earliest lease expiry left in the shard or
-- false}: the firer reclaims the shard again only once that can have run out (at or
-- before now: more expired than the most returned).
-- Invariant: a returned id is due at once; its interrupted attempt is counted, so the
-- delivered `blackbox-attempt` header tells consumers a duplicate is possible.
local ids = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
if #ids > 0 then
  for _, id in ipairs(ids) do
    redis.call('ZADD', KEYS[2], 'NX', ARGV[1], id)
    redis.call('HINCRBY', KEYS[3], id, 1)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #ids - 1)
end
local lease = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#ids, lease[2] or false}

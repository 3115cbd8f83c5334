#!lua flags=allow-oom
-- Prune one caller's owned set in one shard, then count it: the caller's ids that are
-- pending here, for its quota (quotas.py). Runs over maxmemory: it only frees.
--
-- KEYS[1]  the caller's owned set (id -> the due time it was last stored with, epoch ms)
-- KEYS[2]  due sorted set (id -> due epoch ms)
-- KEYS[3]  in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[4]  owners set (callers with an owned set in this shard)
-- ARGV[1]  now, epoch ms: only ids the owned set holds as due by then are looked at
-- ARGV[2]  how many of them at most (bounds the call; the rest wait for the next)
-- ARGV[3]  the caller, as in its ids (percent-encoded): its entry in the owners set
--
-- An id due by now that is neither due nor in flight has ended (fired, cancelled, dead-
-- lettered, its series over): it leaves the set. One still due later (a series moved
-- on, a reschedule) is kept under its due time now. One in flight stays as it is.
--
-- Returns: {ids removed, ids left in the set}.
-- Invariant: touches nothing but the owned set and, once it is empty, the owners set.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local removed = 0
for _, id in ipairs(ids) do
  local due = redis.call('ZSCORE', KEYS[2], id)
  if due then
    redis.call('ZADD', KEYS[1], due, id)
  elseif not redis.call('ZSCORE', KEYS[3], id) then
    redis.call('ZREM', KEYS[1], id)
    removed = removed + 1
  end
end
local left = redis.call('ZCARD', KEYS[1])
if left == 0 then redis.call('SREM', KEYS[4], ARGV[3]) end
return {removed, left}

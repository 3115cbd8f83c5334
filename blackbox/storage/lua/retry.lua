#!lua flags=allow-oom
-- Give ids whose delivery failed back to the due set at a later time, counting the attempt.
--
-- Runs on a Redis over `maxmemory` (allow-oom): it moves ids back to due (an attempts field
-- is the only growth), so a failed delivery on a full Redis is retried, not stuck in flight.
--
-- KEYS[1]     in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[2]     due sorted set (id -> due epoch ms)
-- KEYS[3]     attempts hash (id -> failed attempts)
-- ARGV[1]     the lease token the ids were claimed with
-- ARGV[2]     when to try again, epoch ms
-- ARGV[3..n]  ids
--
-- Returns: how many ids were given back.
-- Invariant: only ids still held under this lease move; the payload is untouched.
local moved = 0
local token = tonumber(ARGV[1])
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == token then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[i])
    redis.call('HINCRBY', KEYS[3], ARGV[i], 1)
    moved = moved + 1
  end
end
return moved

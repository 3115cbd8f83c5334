#!lua flags=allow-oom
-- Hand claimed ids back to due, untouched, when their payload turned out not yet due (a
-- guard: every script keeps a payload's due time at or before its due score).
--
-- Runs on a Redis over `maxmemory` (allow-oom): it moves ids back to due, memory stays level.
--
-- KEYS[1]        in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[2]        due sorted set (id -> due epoch ms)
-- ARGV[1]        the lease token the ids were claimed with
-- ARGV[2i..2i+1] an id and the due time of its payload, epoch ms
--
-- Returns: how many ids were handed back.
-- Invariant: only ids still held under this lease move; the payload and the attempts are
-- untouched; an id already due again (the update put it there) keeps its due time.
local released = 0
local token = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == token then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZADD', KEYS[2], 'NX', ARGV[i + 1], ARGV[i])
    released = released + 1
  end
end
return released

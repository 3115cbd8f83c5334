-- Forget delivered (or dead-lettered) ids still held under the caller's lease.
--
-- KEYS[1]      in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[2]      attempts hash (id -> failed attempts)
-- KEYS[1 + i]  payload key of ARGV[1 + i], for i >= 2
-- ARGV[1]      the lease token the ids were claimed with
-- ARGV[2..n]   ids
--
-- Returns: how many ids were removed.
-- Invariant: an id whose lease expired and was claimed again by another replica is left
-- to that replica (it will deliver once more: at-least-once, never lost).
local acked = 0
local token = tonumber(ARGV[1])
-- Attempts are recorded only after a failure: usually the hash is empty.
local tracked = redis.call('HLEN', KEYS[2]) > 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == token then
    redis.call('ZREM', KEYS[1], ARGV[i])
    if tracked then
      redis.call('HDEL', KEYS[2], ARGV[i])
    end
    redis.call('DEL', KEYS[1 + i])
    acked = acked + 1
  end
end
return acked

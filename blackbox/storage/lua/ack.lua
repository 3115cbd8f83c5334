#!lua flags=allow-oom
-- Forget delivered (or dead-lettered) ids still held under the caller's lease.
--
-- Runs on a Redis over `maxmemory` (allow-oom): deleting delivered payloads is what frees a
-- full Redis (a caller's id leaves a marker far smaller than its payload).
--
-- KEYS[1]      in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[2]      due sorted set (id -> due epoch ms)
-- KEYS[3]      attempts hash (id -> failed attempts)
-- KEYS[2i+2]   payload key of the i-th id
-- KEYS[2i+3]   ended-marker key of the i-th id
-- ARGV[1]      the lease token the ids were claimed with
-- ARGV[2]      how long an ended-marker is kept, seconds
-- ARGV[3]      "1": also tell which ids ended here, and how (the store topic's tombstones)
-- ARGV[4..n]   ids
--
-- Returns: how many ids were removed; with ARGV[3] "1", an array: that count, then per id
-- that ended here (not due again after an update that came while it flew) the id and "f"
-- (delivered or dead-lettered) or "c" (cancelled while in flight).
-- Invariants: an id whose lease expired and was claimed again by another replica is left
-- to that replica (it will deliver once more: at-least-once, never lost). An id updated
-- while in flight is due again: its new payload stays. A caller's id ('@...') that ends
-- here leaves an "f" marker, so a later cancel answers already_fired; a "c" marker (it was
-- cancelled while in flight, and skipped) is kept.
local acked = 0
local token = tonumber(ARGV[1])
local report = ARGV[3] == '1'
local ended = {0}
-- Attempts are recorded only after a failure: usually the hash is empty.
local tracked = redis.call('HLEN', KEYS[3]) > 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local k = 2 * (i - 3)
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) == token then
    redis.call('ZREM', KEYS[1], id)
    if tracked then
      redis.call('HDEL', KEYS[3], id)
    end
    if not redis.call('ZSCORE', KEYS[2], id) then
      redis.call('DEL', KEYS[k + 2])
      local how = 'f'
      if string.sub(id, 1, 1) == '@' then
        if redis.call('GET', KEYS[k + 3]) == 'c' then
          how = 'c'
        else
          redis.call('SET', KEYS[k + 3], 'f', 'EX', ARGV[2])
        end
      end
      if report then
        ended[#ended + 1] = id
        ended[#ended + 1] = how
      end
    end
    acked = acked + 1
  end
end
if report then
  ended[1] = acked
  return ended
end
return acked

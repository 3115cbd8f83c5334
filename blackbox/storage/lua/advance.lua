#!lua flags=allow-oom
-- Settle fired occurrences of series still held under the caller's lease: store each one's
-- next occurrence, or end the series, in the same atomic step that acknowledges this one.
-- A crash before it leaves the occurrence in flight: its lease runs out and the same
-- occurrence fires again (at least once); it is never skipped nor stored twice.
--
-- Runs on a Redis over `maxmemory` (allow-oom), as ack.lua: a series' next payload takes
-- the place of the one it replaces.
--
-- KEYS[1]      in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[2]      due sorted set (id -> due epoch ms)
-- KEYS[3]      attempts hash (id -> failed attempts)
-- KEYS[2i+2]   payload key of the i-th id
-- KEYS[2i+3]   ended-marker key of the i-th id
-- ARGV[1]      the lease token the ids were claimed with
-- ARGV[2]      how long an ended-marker is kept, seconds
-- ARGV[4i-1..4i+2]  per id: the id, the next due ms ('' when the series ends here), the
--              next payload's TTL in seconds, the next payload
--
-- Returns: how many ids were settled.
-- Invariants: an id whose lease was lost is left to its new claimer. An id updated while in
-- flight is due again: its new version stays. One cancelled while in flight (its "c"
-- marker) ends here. One paused or resumed while in flight keeps that: the paused bit (64
-- of the flags byte, offset 9, see schedule.py) is taken from the payload stored now.
local settled = 0
local token = tonumber(ARGV[1])
local i = 0
for a = 3, #ARGV, 4 do
  i = i + 1
  local id, due, ttl, payload = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local payload_key, marker_key = KEYS[2 * i + 2], KEYS[2 * i + 3]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) == token then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
    if not redis.call('ZSCORE', KEYS[2], id) then
      local marker = redis.call('GET', marker_key)
      if due == '' or marker == 'c' then
        redis.call('DEL', payload_key)
        if marker ~= 'c' then
          redis.call('SET', marker_key, 'f', 'EX', ARGV[2])
        end
      else
        local current = redis.call('GET', payload_key)
        if current and string.byte(current, 1) == 2 then
          local held = bit.band(string.byte(current, 10), 64)
          local flags = bit.bor(bit.band(string.byte(payload, 10), 191), held)
          payload = string.sub(payload, 1, 9) .. string.char(flags) .. string.sub(payload, 11)
        end
        redis.call('SET', payload_key, payload, 'EX', ttl)
        redis.call('ZADD', KEYS[2], due, id)
      end
    end
    settled = settled + 1
  end
end
return settled

-- Store the schedules of one intake partition that were not stored yet, and move that
-- partition's watermark past them, in one atomic step.
--
-- KEYS[1]      due sorted set (id -> due epoch ms)
-- KEYS[2]      intake watermarks hash ("topic:partition" -> highest offset handled)
-- KEYS[2 + i]  payload key of the i-th schedule
-- ARGV[1]      the watermark field, "topic:partition"
-- ARGV[2]      the offset the watermark moves to (the last record of the chunk, bad ones too)
-- ARGV[5i-2]   intake offset of the i-th schedule (ascending)
-- ARGV[5i-1]   its id
-- ARGV[5i]     its due time, epoch ms
-- ARGV[5i+1]   its payload TTL, seconds
-- ARGV[5i+2]   its encoded payload
--
-- Returns: how many schedules were new.
-- Invariant: a record at or below the watermark was handled before (stored, or fired and
-- forgotten); re-reading it after a crash changes nothing. SET NX guards the same id.
local mark = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '-1')
local stored = 0
for i = 1, #KEYS - 2 do
  local a = 5 * (i - 1) + 2
  if tonumber(ARGV[a + 1]) > mark
      and redis.call('SET', KEYS[2 + i], ARGV[a + 5], 'NX', 'EX', ARGV[a + 4]) then
    redis.call('ZADD', KEYS[1], 'NX', ARGV[a + 3], ARGV[a + 2])
    stored = stored + 1
  end
end
if tonumber(ARGV[2]) > mark then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return stored

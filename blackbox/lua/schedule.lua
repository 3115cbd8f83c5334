-- Store schedules that are not stored yet: payload with a TTL, id into the due set.
--
-- KEYS[1]      due sorted set (id -> due epoch ms)
-- KEYS[1 + i]  payload key of the i-th schedule
-- ARGV[4i-3]   id of the i-th schedule
-- ARGV[4i-2]   its due time, epoch ms
-- ARGV[4i-1]   its payload TTL, seconds
-- ARGV[4i]     its encoded payload
--
-- Returns: how many schedules were new.
-- Invariant: an id is in the due set only while its payload exists or has just expired;
-- a replayed id (payload present, due or in flight) is left exactly as it was.
local stored = 0
for i = 1, #KEYS - 1 do
  local a = 4 * (i - 1)
  if redis.call('SET', KEYS[1 + i], ARGV[a + 4], 'NX', 'EX', ARGV[a + 3]) then
    redis.call('ZADD', KEYS[1], 'NX', ARGV[a + 2], ARGV[a + 1])
    stored = stored + 1
  end
end
return stored

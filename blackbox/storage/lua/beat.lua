#!lua flags=allow-oom
-- A shard's clock: the time the intake last found this Redis whole, moved on by the intake
-- every few seconds, and the mark left where Redis was found to have lost data (clocks.py).
-- Looked at, and moved, only under a condition: a Redis that went back in time (a restored
-- snapshot) or came back empty (a flush, a restart without its data) must not have its
-- evidence written over before it was judged.
--
-- Runs on a Redis over `maxmemory` (allow-oom): one field is written, and a full Redis is
-- the one whose clock matters most.
--
-- KEYS[1]  the shard's clock hash ("at": epoch ms; "lost": why Redis was found to have
--          lost data, left for the operator)
-- ARGV[1]  the floor, epoch ms: the newest clock this process saw here, less the longest
--          lag a failover can lose (BLACKBOX_REDIS_MAX_LAG); -1 where it saw none yet
-- ARGV[2]  "1": move the clock to ARGV[3] (an intake that judged this Redis); "0": look
-- ARGV[3]  now, epoch ms
--
-- Returns {state, at or false, lost or false}. state: "ok" the clock is at or above the
-- floor; "none" no clock and no floor (a namespace new to this process: created when
-- writing); "missing" no clock where this process saw one (flushed, or restarted empty);
-- "stale" the clock is below the floor (restored from an older snapshot); "lost" the
-- mark is there (nothing is moved until the operator acts).
local at = redis.call('HGET', KEYS[1], 'at')
local lost = redis.call('HGET', KEYS[1], 'lost')
local floor = tonumber(ARGV[1])
if lost then
  return {'lost', at, lost}
end
if not at then
  if floor >= 0 then
    return {'missing', false, false}
  end
  if ARGV[2] == '1' then
    redis.call('HSET', KEYS[1], 'at', ARGV[3])
    return {'ok', ARGV[3], false}
  end
  return {'none', false, false}
end
if tonumber(at) < floor then
  return {'stale', at, false}
end
if ARGV[2] == '1' and tonumber(ARGV[3]) > tonumber(at) then
  redis.call('HSET', KEYS[1], 'at', ARGV[3])
  at = ARGV[3]
end
return {'ok', at, false}

#!lua flags=allow-oom
-- A shard's clock: the time the intake last found this Redis whole and the server it found
-- it on, moved on by the intake every few seconds, and the mark left where Redis was found
-- to have lost data (clocks.py). Looked at, and moved, only under a condition: a Redis that
-- went back in time (a restored snapshot) or came back empty (a flush, a restart without
-- its data) must not have its evidence written over before it was judged.
--
-- Runs on a Redis over `maxmemory` (allow-oom): two fields are written, and a full Redis is
-- the one whose clock matters most.
--
-- KEYS[1]  the shard's clock hash ("at": epoch ms; "server": the run id of the Redis it was
--          moved on; "lost": why Redis was found to have lost data, left for the operator)
-- ARGV[1]  the floor, epoch ms: the newest clock this process saw here, less the longest
--          lag a failover can lose (BLACKBOX_REDIS_MAX_LAG); -1 where it saw none yet
-- ARGV[2]  "1": move the clock to ARGV[3] (an intake that judged this Redis); "0": look
-- ARGV[3]  now, epoch ms
-- ARGV[4]  with "1": the run id of the Redis serving this shard now
--
-- Returns {state, at or false, lost or false, server or false}, the server as it was
-- before this call. state: "ok" the clock is at or above the floor; "none" no clock and no
-- floor (a namespace new to this process: created when writing); "missing" no clock where
-- this process saw one (flushed, or restarted empty); "stale" the clock is below the floor
-- (restored from an older snapshot); "lost" the mark is there (nothing is moved until the
-- operator acts).
local clock = redis.call('HMGET', KEYS[1], 'at', 'lost', 'server')
local at, lost, server = clock[1], clock[2], clock[3]
local floor = tonumber(ARGV[1])
if lost then
  return {'lost', at, lost, server}
end
if not at then
  if floor >= 0 then
    return {'missing', false, false, server}
  end
  if ARGV[2] == '1' then
    redis.call('HSET', KEYS[1], 'at', ARGV[3], 'server', ARGV[4])
    return {'ok', ARGV[3], false, server}
  end
  return {'none', false, false, server}
end
if tonumber(at) < floor then
  return {'stale', at, false, server}
end
if ARGV[2] == '1' then
  if tonumber(ARGV[3]) > tonumber(at) then
    at = ARGV[3]
  end
  redis.call('HSET', KEYS[1], 'at', at, 'server', ARGV[4])
end
return {'ok', at, false, server}

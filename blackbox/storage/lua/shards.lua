#!lua flags=allow-oom
-- The namespace's shard count, and the heartbeats of the processes running with it, kept
-- together: a process is counted among the running only while the count is its own, and
-- the count changes only while no other process runs (any role: intake writes into the
-- shards of its count as surely as firing reads them).
--
-- Runs on a Redis over `maxmemory` (allow-oom): a heartbeat renews its own member (memory
-- stays level), and a process that cannot renew it on a full Redis would stop the others
-- from knowing it runs.
--
-- KEYS[1]  shard count (string)
-- KEYS[2]  heartbeats of running processes, any role (sorted set: name -> expiry epoch ms)
-- KEYS[3]  heartbeats of firing processes (sorted set: name -> expiry; see shares.py)
-- ARGV[1]  this process's shard count
-- ARGV[2]  now, epoch ms
-- ARGV[3]  this process's name
-- ARGV[4]  its heartbeat's expiry, epoch ms
-- ARGV[5]  'keep': beat only if the count is this process's; 'change': make it so
-- ARGV[6]  for 'change': the count found before (empty: none recorded); another is a race
--
-- Returns: {outcome, the recorded count or false, other live processes}: outcome 'ok'
-- (the count is ARGV[1], the heartbeat renewed), 'other' ('keep': another count is
-- recorded), 'raced' ('change': the count moved since it was read), or 'busy' ('change':
-- other processes still run).
-- Invariant: a heartbeat is only ever written under the process's own count.
local recorded = redis.call('GET', KEYS[1])
if recorded == ARGV[1] then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
  return {'ok', recorded, 0}
end
if ARGV[5] == 'keep' then
  return {'other', recorded or false, 0}
end
if (recorded or '') ~= ARGV[6] then
  return {'raced', recorded or false, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
local others = 0
for k = 2, 3 do
  others = others + redis.call('ZCOUNT', KEYS[k], '(' .. ARGV[2], '+inf')
  local mine = redis.call('ZSCORE', KEYS[k], ARGV[3])
  if mine and tonumber(mine) > tonumber(ARGV[2]) then
    others = others - 1
  end
end
if others > 0 then
  return {'busy', recorded or false, others}
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return {'ok', ARGV[1], 0}

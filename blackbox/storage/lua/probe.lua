#!lua flags=no-writes,allow-cross-slot-keys
-- Which of many shards have something due: the firing tick's look at every shard it fires,
-- so that a shard is claimed only where something is due (a claim is a script and two
-- ZRANGEs; a shard with nothing in it costs nothing here on one Redis).
--
-- Reads only. Its keys are named in ARGV, not KEYS, and are of many slots: on a Redis
-- Cluster it is sent to one master with the shards that master serves (allow-cross-slot-
-- keys, Redis >= 7.0), where each command still touches one slot.
--
-- ARGV[1]        "1": every key may go into one command (one Redis, not a cluster)
-- ARGV[3i-1..3i+1]  per shard i: its due set, its in-flight set, the due-by time (epoch ms)
--
-- Returns: per shard, 1 if an id is due by its time, 0 if not, -1 if the shard holds no
-- due and no in-flight id at all (it has no lease to reclaim either).
local shards = (#ARGV - 1) / 3
local answer = {}
if ARGV[1] == '1' then
  local keys = {}
  for i = 0, shards - 1 do
    keys[#keys + 1] = ARGV[3 * i + 2]
    keys[#keys + 1] = ARGV[3 * i + 3]
  end
  -- Nothing pending anywhere (idle): one command for all the shards. unpack() takes about
  -- 8,000 values: 4,000 shards, more than a namespace may have.
  if redis.call('EXISTS', unpack(keys)) == 0 then
    for i = 1, shards do
      answer[i] = -1
    end
    return answer
  end
end
for i = 0, shards - 1 do
  local due, fly, by = ARGV[3 * i + 2], ARGV[3 * i + 3], ARGV[3 * i + 4]
  if ARGV[1] ~= '1' and redis.call('EXISTS', due, fly) == 0 then
    answer[i + 1] = -1
  else
    answer[i + 1] = #redis.call('ZRANGE', due, '-inf', by, 'BYSCORE', 'LIMIT', 0, 1)
  end
end
return answer

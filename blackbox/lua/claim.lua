-- Move due ids into the in-flight set under a lease, in one atomic step.
--
-- KEYS[1]  due sorted set (id -> due epoch ms)
-- KEYS[2]  in-flight sorted set (id -> lease expiry epoch ms)
-- ARGV[1]  now, epoch ms: ids due at or before it are taken
-- ARGV[2]  the most ids to take
-- ARGV[3]  lease expiry, epoch ms; also the token the claimer acks with
--
-- Returns: {ids taken (earliest due first), due time of the earliest id left or false}.
-- Invariant: two claimers never receive the same id while its lease runs. (An id updated
-- while in flight is in both sets: its new version is due. Claiming it again moves the
-- lease to the new claimer; the old one's ack then finds its lease lost.)
local ids = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2])
if #ids > 0 then
  for _, id in ipairs(ids) do
    redis.call('ZADD', KEYS[2], ARGV[3], id)
  end
  -- The ids taken are exactly the lowest ranks of the due set.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #ids - 1)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {ids, first[2] or false}

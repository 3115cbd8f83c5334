#!lua
-- Move one pending id to a new due time, replacing its payload with the same schedule
-- re-encoded for that time, if the payload is still the one the caller read
-- (compare-and-set: the encoding is Python's, in schedule.py).
--
-- Refused whole, before it runs, by a Redis over `maxmemory` (a shebang without allow-oom):
-- the API answers 503 and the schedule keeps its due time.
--
-- KEYS[1]  due sorted set (id -> due epoch ms)
-- KEYS[2]  in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[3]  the id's payload key
-- KEYS[4]  the id's ended-marker key ("f" fired, "c" cancelled)
-- ARGV[1]  the id
-- ARGV[2]  the new due time, epoch ms
-- ARGV[3]  the payload read before, to compare with
-- ARGV[4]  the new payload
-- ARGV[5]  the new payload's TTL, seconds
--
-- Returns: 2 updated, 3 cancelled, 4 already fired or being produced right now, 5 not
-- found, 6 the payload changed since it was read (read it again).
-- Invariant: an id in flight is never moved (its firer owns it until it acks), so a
-- reschedule never makes a message fire twice.
local sets = {due = KEYS[1], fly = KEYS[2]}
local id = ARGV[1]
if redis.call('ZSCORE', sets.fly, id) then return 4 end
if not redis.call('ZSCORE', sets.due, id) then return ended_code(sets, KEYS[4], id) end
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return 6 end
redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[5])
redis.call('ZADD', sets.due, 'XX', ARGV[2], id)
return 2

#!lua flags=allow-oom
-- Cancel one pending id, as an intake cancel record would (the same cancel() of
-- pending.lua, which the store loads in front of this), without an intake watermark: the
-- HTTP API's DELETE.
--
-- Runs on a Redis over `maxmemory` (allow-oom): it frees a payload for a small marker.
--
-- KEYS[1]  due sorted set (id -> due epoch ms)
-- KEYS[2]  in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[3]  attempts hash (id -> failed attempts)
-- KEYS[4]  the id's payload key
-- KEYS[5]  the id's ended-marker key ("f" fired, "c" cancelled)
-- ARGV[1]  the id
-- ARGV[2]  how long the ended-marker is kept, seconds
--
-- Returns: 3 cancelled, 4 already fired (or being produced), 5 not found.
-- Invariant: as for intake.lua's cancel: a cancelled id is in neither set as pending, and
-- an id being produced keeps its payload until its firer acks.
local sets = {due = KEYS[1], fly = KEYS[2], attempts = KEYS[3]}
return cancel(sets, KEYS[4], KEYS[5], ARGV[1], ARGV[2])

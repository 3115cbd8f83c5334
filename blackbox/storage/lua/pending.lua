-- Functions shared by the scripts that end one pending id: intake.lua (a cancel record) and
-- cancel.lua (a cancel through the HTTP API). The store puts this file in front of theirs
-- when it loads them (after their shebang line), so both cancels run the same code,
-- atomically.
--
-- `sets` names the keys they touch, each taken from the calling script's KEYS[]:
--   sets.due       due sorted set (id -> due epoch ms)
--   sets.fly       in-flight sorted set (id -> lease expiry epoch ms)
--   sets.attempts  attempts hash (id -> failed attempts)

-- How an id that is not pending ended, read only: 3 cancelled, 4 fired or firing, 5 unknown.
-- A cancel answered already is answered alike while the version it could not stop (or a
-- series' last occurrence) is still being produced.
local function ended_code(sets, marker_key, id)
  local ended = redis.call('GET', marker_key)
  if ended == 'c' then return 3 end
  if ended == 'f' or redis.call('ZSCORE', sets.fly, id) then return 4 end
  return 5
end

-- Whether a stored payload is a series' (schedule.py: version 2, flag 32 of the flags byte).
local function is_series(payload)
  return payload and string.byte(payload, 1) == 2 and bit.band(string.byte(payload, 10), 32) ~= 0
end

-- Drop a pending id (its payload too, unless a replica is producing it: the dispatcher then
-- skips it on the "c" marker) and remember for `retention` seconds that it was cancelled.
-- A series being fired ends too: the occurrence in flight is delivered, and its "c" marker
-- keeps advance.lua from storing the next.
-- Returns 3 cancelled, or how it ended before (see ended_code).
local function cancel(sets, payload_key, marker_key, id, retention)
  local firing_series = redis.call('ZSCORE', sets.fly, id) and redis.call('GET', marker_key) ~= 'c'
    and is_series(redis.call('GET', payload_key))
  if redis.call('ZSCORE', sets.due, id) or firing_series then
    redis.call('ZREM', sets.due, id)
    redis.call('HDEL', sets.attempts, id)
    if not redis.call('ZSCORE', sets.fly, id) then
      redis.call('DEL', payload_key)
    end
    redis.call('SET', marker_key, 'c', 'EX', retention)
    return 3
  end
  return ended_code(sets, marker_key, id)
end

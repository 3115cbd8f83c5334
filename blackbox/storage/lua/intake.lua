#!lua
-- Apply the requests of one intake partition that were not applied yet (schedule, update,
-- cancel), and move that partition's watermark past them, in one atomic step.
--
-- Refused whole, before it runs, by a Redis over `maxmemory` (a shebang without allow-oom):
-- intake pauses and is read again once firing has freed memory, so nothing half-applied.
-- Cancels wait with it: they sit in the intake topic behind the records before them.
--
-- KEYS[1]      due sorted set (id -> due epoch ms)
-- KEYS[2]      in-flight sorted set (id -> lease expiry epoch ms)
-- KEYS[3]      intake watermarks hash ("topic:partition" -> highest offset handled)
-- KEYS[4]      attempts hash (id -> failed attempts)
-- KEYS[5]      owners set (the callers with an owned set in this shard)
-- KEYS[6]      where ARGV[6] restates: the restate sorted set ("field|id" -> epoch ms a
--              caller's id was stored anew as its ended-marker was removed: firing's
--              tombstone of its last version may land in the store topic after this
--              version, which intake writes again later: intake/restating.py)
-- KEYS[6..]    (KEYS[7..] where ARGV[6] restates) per request, in order: the payload key
--              of its id; then, for a caller's id (every op but "n"), the ended-marker key
--              of that id ("f" fired, "c" cancelled); then, where ARGV[6] counts, the
--              owned set of its caller
-- ARGV[1]      the watermark field, "topic:partition"
-- ARGV[2]      the offset the watermark moves to (the last record of the chunk, bad ones too)
-- ARGV[3]      how long an ended-marker is kept, seconds
-- ARGV[4]      length in bytes of the namespace's hash tag: a payload key is the tag, then
--              the id
-- ARGV[5]      the watermark the chunk before this one leaves (-1 for the first chunk of
--              its partition in an intake session: no condition)
-- ARGV[6]      two flags: its first "1": count each caller's ids in its owned set (a
--              policy sets quotas); its second "1": note in the restate set each caller's
--              id stored anew just after it ended (a store topic is set)
-- ARGV[5i+2..5i+6]  per request: intake offset (ascending), op, due ms, payload TTL s,
--              encoded payload. op "n": a new id derived from the record (SET NX);
--              "u": a caller's id, stored or replaced; "c": cancel a caller's id (due,
--              TTL and payload unused); "m": move a caller's pending id to the due time,
--              its payload kept but for the due time it encodes (payload unused); "o": a
--              caller's id stored only if it is neither pending nor ended lately (answered
--              7 when it is pending already, else as it ended: a retried create is a no-op);
--              "p" / "r": pause / resume a caller's series (due, TTL and payload unused).
--
-- Returns: one code per request: 0 already applied (a re-read), 1 scheduled, 2 updated,
-- 3 cancelled, 4 already fired (or, for a move, being produced right now), 5 not found,
-- 7 already pending (op "o": nothing changed), 8 applied before and still pending or in
-- flight (a re-read: answered again, nothing changed), 9 not a series (a pause or resume of
-- a one-off schedule), 10 paused, 11 resumed, 12 a series (a move of a series: nothing
-- changed; its occurrences follow its rule). An error, changing nothing, when the chunk
-- before this one did not run (its call failed): applying this one would move the
-- watermark past requests never applied, and a retry would skip them as re-reads; and
-- likewise (BLACKBOX_CORRUPT) when the shard's due key is not a sorted set, or a new id's
-- key holds a value blackbox did not write (see written_before: the requests before it in
-- the call stay applied, the watermark does not move).
-- Invariants: a record at or below the watermark was applied before; re-reading it after a
-- crash changes nothing (a re-read cancel is answered again from the ended-marker, read
-- only). An id in flight keeps its payload until its firer acks, so an update that lands
-- while it is being produced is queued as a new schedule, not lost; the dispatcher skips
-- a claimed id whose payload turns out cancelled ("c").
-- Plain requests pass one key and five arguments: they are most of the traffic.
--
-- Grouped form, on one Redis (not a cluster: its keys span shards): the chunks of several
-- shards (or partitions) in one call, so a poll costs a call per node, not per shard.
-- ARGV[1] "*", ARGV[2] the number of groups n, ARGV[2g+1], ARGV[2g+2] the number of keys
-- and of arguments of group g; then each group's keys in KEYS and its arguments in ARGV, in
-- order, each as the single form takes them. No two groups share a shard and a partition.
-- Every group's watermark is checked before any is applied: one refused refuses the whole
-- call, changing nothing. Returns the groups' codes one after the other.
-- ended_code() and cancel() come from pending.lua, which the store loads in front of this.

-- A chunk's watermark as it stands, and the refusal of the chunk (nil if none): its
-- previous chunk did not run, or its shard's due key holds another type than a sorted set
-- (overwritten from outside). That is looked at before anything is written: a ZADD that
-- failed after a new id's SET NX would leave its payload behind, which the retry would
-- take for a request applied before, the id never due. (A wrong type met later, on
-- another key of the shard, fails the call after the requests before it were written, and
-- before the watermark moved: the retry finds those ids due, and answers them as such.)
local function gap(KEYS, ARGV)
  local mark = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '-1')
  if mark < tonumber(ARGV[5]) then
    return mark, redis.error_reply('BLACKBOX_GAP the previous chunk of ' .. ARGV[1] .. ' was not applied')
  end
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind ~= 'zset' and kind ~= 'none' then
    return mark, redis.error_reply('BLACKBOX_CORRUPT ' .. KEYS[1] .. ' holds a ' .. kind ..
      ', not a sorted set: nothing of this intake call was applied')
  end
  return mark, nil
end

-- A new id whose key is taken already: its own version, written by a call that failed
-- before its watermark moved, read again (an encoding or index mode's reference of the same
-- due time: bytes 2 to 9), or a stray value nothing of blackbox wrote there. That one refuses the call
-- (BLACKBOX_CORRUPT): taken for applied, the schedule would be answered and never due.
local function written_before(payload_key, payload)
  local kind = redis.call('TYPE', payload_key)['ok']
  local held = kind == 'string' and redis.call('GET', payload_key)
  if not held or string.sub(held, 2, 9) ~= string.sub(payload, 2, 9)
      or not string.find('\1\2\3', string.sub(held, 1, 1), 1, true) then
    error({err = 'BLACKBOX_CORRUPT ' .. payload_key .. ' holds a ' .. kind ..
      ' that blackbox did not write: delete it, and intake goes on'})
  end
end

-- One chunk of one shard (KEYS and ARGV as the single form takes them), its watermark as
-- `gap` read it (no two chunks of one call share it); its codes.
local function apply(KEYS, ARGV, mark)
  local retention = ARGV[3]
  local codes = {}
  local counting = string.sub(ARGV[6], 1, 1) == '1'
  local restate_key = string.sub(ARGV[6], 2, 2) == '1' and KEYS[6]

  local function upsert(payload_key, marker_key, id, due, ttl, payload)
    local pending = redis.call('ZSCORE', KEYS[1], id)
    redis.call('SET', payload_key, payload, 'EX', ttl)
    redis.call('ZADD', KEYS[1], due, id)
    if redis.call('DEL', marker_key) == 1 and restate_key then
      local now = redis.call('TIME')
      redis.call('ZADD', restate_key, now[1] * 1000 + math.floor(now[2] / 1000),
                 ARGV[1] .. '|' .. id)
    end
    redis.call('HDEL', KEYS[4], id)
    if pending then return 2 end
    return 1
  end

  local sets = {due = KEYS[1], fly = KEYS[2], attempts = KEYS[4]}

  -- An epoch-ms due time as the payload encodes it (schedule.py): 8 bytes, big-endian.
  local function be64(n)
    local bytes = {}
    for i = 8, 1, -1 do
      bytes[i] = string.char(n % 256)
      n = math.floor(n / 256)
    end
    return table.concat(bytes)
  end

  -- As the API's reschedule: an id in flight is never moved (its firer owns it).
  -- `stored` (index mode): a reference to the moved version's store record, kept in
  -- place of the payload; empty: the payload's due time is rewritten.
  local function move(payload_key, marker_key, id, due, ttl, stored)
    if redis.call('ZSCORE', KEYS[2], id) then return 4 end
    local payload = redis.call('GET', payload_key)
    if not redis.call('ZSCORE', KEYS[1], id) or not payload then
      return ended_code(sets, marker_key, id)
    end
    -- A series moves by its rule: sending it again changes that.
    if is_series(payload) then return 12 end
    local moved = stored
    if moved == '' then
      moved = string.sub(payload, 1, 1) .. be64(tonumber(due)) .. string.sub(payload, 10)
    end
    redis.call('SET', payload_key, moved, 'EX', ttl)
    redis.call('ZADD', KEYS[1], 'XX', due, id)
    return 2
  end

  -- Pause or resume a series: the paused bit (64) of its payload's flags byte, nothing else.
  -- A series paused stays due: the dispatcher passes over its occurrences until resumed.
  local function hold(payload_key, marker_key, id, pause)
    local payload = redis.call('GET', payload_key)
    local pending = redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)
    -- (A series cancelled while an occurrence is in flight keeps its payload till settled.)
    if not payload or not pending or redis.call('GET', marker_key) == 'c' then
      return ended_code(sets, marker_key, id)
    end
    if not is_series(payload) then return 9 end
    local flags = string.byte(payload, 10)
    if pause then flags = bit.bor(flags, 64) else flags = bit.band(flags, 191) end
    local held = string.sub(payload, 1, 9) .. string.char(flags) .. string.sub(payload, 11)
    redis.call('SET', payload_key, held, 'KEEPTTL')
    if pause then return 10 end
    return 11
  end

  local tag_length = tonumber(ARGV[4])
  -- A caller's ids in its owned set, by due time (quotas.py prunes the ended ones).
  local listed = {}  -- the owned sets this call has put in the owners set already
  local function own(owned_key, id, due)
    if not owned_key then return end
    redis.call('ZADD', owned_key, due, id)
    if not listed[owned_key] then
      redis.call('SADD', KEYS[5], string.sub(owned_key, tag_length + 6))
      listed[owned_key] = true
    end
  end
  local k = 6
  if restate_key then k = 7 end
  for a = 7, #ARGV, 5 do
    local payload_key, op = KEYS[k], ARGV[a + 1]
    local id = string.sub(payload_key, tag_length + 1)
    local marker_key = false
    if op == 'n' then
      k = k + 1
    else
      marker_key = KEYS[k + 1]
      k = k + 2
    end
    local owned_key = false
    if counting then
      owned_key = KEYS[k]
      k = k + 1
    end
    local code = 0
    if tonumber(ARGV[a]) <= mark then
      -- Applied before: its first answer may have been lost with the replica that applied
      -- it, so it is answered again from what is there now. A cancel: how the id ended; any
      -- other request whose id is still pending or in flight: 8.
      if op == 'c' and not redis.call('ZSCORE', KEYS[1], id) then
        local again = ended_code(sets, marker_key, id)
        if again ~= 5 then code = again end
      elseif op ~= 'c' and (redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)) then
        code = 8
      end
    else
      if op == 'n' then
        if redis.call('SET', payload_key, ARGV[a + 4], 'NX', 'EX', ARGV[a + 3]) then
          redis.call('ZADD', KEYS[1], 'NX', ARGV[a + 2], id)
          code = 1
        else
          written_before(payload_key, ARGV[a + 4])
        end
      elseif op == 'u' then
        code = upsert(payload_key, marker_key, id, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      elseif op == 'o' then
        if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
          code = 7
        else
          code = ended_code(sets, marker_key, id)
          if code == 5 then
            code = upsert(payload_key, marker_key, id, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
          end
        end
      elseif op == 'm' then
        code = move(payload_key, marker_key, id, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      elseif op == 'p' or op == 'r' then
        code = hold(payload_key, marker_key, id, op == 'p')
      else
        code = cancel(sets, payload_key, marker_key, id, retention)
      end
      if code == 1 or (code == 2 and op ~= 'm') then
        own(owned_key, id, ARGV[a + 2])
      elseif code == 2 and owned_key then  -- a move: its new due time, where it is counted
        redis.call('ZADD', owned_key, 'XX', ARGV[a + 2], id)
      elseif code == 3 and owned_key then
        redis.call('ZREM', owned_key, id)
      end
    end
    codes[#codes + 1] = code
  end
  if tonumber(ARGV[2]) > mark then
    redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
  end
  return codes
end

if ARGV[1] ~= '*' then
  local mark, refused = gap(KEYS, ARGV)
  if refused then return refused end
  return apply(KEYS, ARGV, mark)
end
local groups, k, a = {}, 0, 2 + 2 * tonumber(ARGV[2])
for g = 1, tonumber(ARGV[2]) do
  local keys, args = {}, {}
  for i = 1, tonumber(ARGV[2 * g + 1]) do keys[i] = KEYS[k + i] end
  for i = 1, tonumber(ARGV[2 * g + 2]) do args[i] = ARGV[a + i] end
  k, a = k + #keys, a + #args
  groups[g] = {keys, args}
end
for _, group in ipairs(groups) do
  local mark, refused = gap(group[1], group[2])
  if refused then return refused end
  group[3] = mark
end
local codes = {}
for _, group in ipairs(groups) do
  for _, code in ipairs(apply(group[1], group[2], group[3])) do codes[#codes + 1] = code end
end
return codes

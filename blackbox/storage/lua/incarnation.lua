-- A new incarnation tag for an intake topic whose offsets restarted while its looked-up
-- topic id did not change (a broker that gives topics no id names them all with the zero
-- id), agreed by compare-and-set so that every replica reading the topic takes one tag.
--
-- KEYS[1]  incarnations hash (topic -> "<looked-up tag> <tag in use>")
-- ARGV[1]  the topic
-- ARGV[2]  the tag looked up from the broker's topic id (empty for the zero id)
-- ARGV[3]  the tag the caller read the restarted partition under
-- ARGV[4]  a fresh tag, taken if the tag in use is still ARGV[3]
--
-- Returns: the tag in use now: ARGV[4] if it replaced ARGV[3], else the one another
-- replica recorded first.
-- Invariant: a recorded tag applies only while the broker still names the topic with the
-- looked-up tag it was recorded against; a topic with a new id gets that id's own tag.
local record = redis.call('HGET', KEYS[1], ARGV[1])
local current = ARGV[2]
if record then
  local looked_up, tag = string.match(record, '^(%S*) (%S+)$')
  if looked_up == ARGV[2] then
    current = tag
  end
end
if current ~= ARGV[3] then
  return current
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[4])
return ARGV[4]

#!lua
-- Index mode: point a pending id at another store record, if it still holds the reference
-- the caller read (compare-and-set). Intake writes a version again where Redis kept
-- another than the one written ahead, and Redis then names the record written last: the
-- one compaction keeps.
--
-- KEYS[1]  the id's payload key
-- ARGV[1]  the reference read
-- ARGV[2]  the reference to keep instead
--
-- Returns 1 when it changed, 0 when the payload was another (fired, moved, updated since).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0

#!lua
-- Whether Redis has room for intake: writes nothing, yet declares (by its shebang without
-- allow-oom or no-writes) that it may write, so Redis refuses it before it runs exactly
-- when it would refuse the intake script: over `maxmemory`, or on a read-only replica.
--
-- KEYS[1]  due sorted set (not touched: it routes the call to the namespace's node)
--
-- Returns: 1.
-- Invariant: changes nothing.
return 1

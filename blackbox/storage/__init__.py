"""Storage: schedules in Redis (the store, its Lua scripts), their keys, shards, connections."""

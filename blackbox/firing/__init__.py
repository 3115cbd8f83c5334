"""Firing: due ids claimed from Redis, produced to their topics, then acknowledged; the shares
of shards each replica fires, and the waker that fires at each due instant."""

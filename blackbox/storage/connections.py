"""Connections to Redis: one client for a single Redis or a Redis Cluster, chosen by the
scheme of REDIS_URL, and the plain clients of a cluster's masters for work each node does.

`redis://`, `rediss://` and `unix://` name one Redis. `redis+cluster://host:port` (or
`rediss+cluster://` for TLS) names any node of a Redis Cluster: redis-py's cluster client
learns the other nodes from it and sends each command to the master holding its keys' slot.
Credentials and query options are written as for `redis://`.
"""

from __future__ import annotations

import re
from typing import Any, TypeAlias

import redis
import structlog
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException

from blackbox.errors import RedisUnreachable, SettingsError

log = structlog.get_logger("blackbox.storage.connections")

RedisClient: TypeAlias = redis.Redis | RedisCluster

# Each cluster scheme and the single-node scheme redis-py's cluster client reads in its place.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

MASK = "********"  # what a password is shown as
_URL_PASSWORD = re.compile(r"(//[^/@:]*:)[^@/]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def mask_url(url: str) -> str:
    """The URL with any password (in the authority or the query) replaced by asterisks."""
    masked = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}@", url)
    return _QUERY_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}", masked)


def is_cluster(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://` or `rediss+cluster://`)."""
    scheme, separator, _ = url.partition("://")
    return bool(separator) and scheme in CLUSTER_SCHEMES


def node_url(url: str) -> str:
    """The cluster URL `url` written as its node's `redis://` (or `rediss://`) URL: the same
    address, credentials and options."""
    scheme, _, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES[scheme]}://{rest}"


def redis_client(
    url: str,
    *,
    socket_timeout: float = 5.0,
    connect_timeout: float = 2.0,
    health_check_interval: int = 10,
) -> RedisClient:
    """A client for the Redis or Redis Cluster that `url` names, failing fast when Redis is
    away so callers can back off; SettingsError naming REDIS_URL if the URL is malformed.

    A single Redis's client connects on first use. The cluster client asks the node for the
    slot map at once: an unreachable cluster raises RedisUnreachable here. redis-py does not
    hand `health_check_interval` (nor unknown query options) to a cluster's node
    connections: it reconnects through its own retries instead.
    """
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "health_check_interval": health_check_interval,
    }
    if is_cluster(url):
        # Made from the URL's parts, not with from_url: redis-py's close() leaves the nodes'
        # connections open on a cluster client made from a URL.
        try:
            return RedisCluster(**{**options, **cluster_options(url)})
        except RedisClusterException as e:
            raise RedisUnreachable(f"Redis Cluster at {mask_url(url)}: {e}") from e
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as e:
        raise bad_url(url, e) from e


def cluster_options(url: str) -> dict[str, Any]:
    """The cluster client's arguments written in the cluster URL `url` (node address,
    credentials, TLS, query options), read as redis-py reads a `redis://` URL; SettingsError
    if they cannot name a node, before any connection is tried."""
    try:
        options: dict[str, Any] = parse_url(node_url(url))  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    except ValueError as e:
        raise bad_url(url, e) from e
    if not options.get("host"):
        raise bad_url(url, "a Redis Cluster URL names one of its nodes as host:port")
    if options.get("db", 0) != 0:
        raise bad_url(url, "a Redis Cluster has only database 0")
    options.pop("connection_class", None)  # rediss: the cluster client takes ssl=True instead
    return {**options, "ssl": url.startswith("rediss+")}


def bad_url(url: str, reason: object) -> SettingsError:
    """The error for a malformed REDIS_URL, its password masked."""
    return SettingsError(f"REDIS_URL={mask_url(url)!r} is invalid: {reason}")


def primaries(client: RedisClient) -> list[redis.Redis]:
    """One plain client per master, for work every node must do (CONFIG GET, probes, script
    loads); a single Redis's client is its own only master."""
    if isinstance(client, RedisCluster):
        nodes = client.get_primaries()  # type: ignore[no-untyped-call]  # unannotated in redis-py
        return [client.get_redis_connection(node) for node in nodes]
    return [client]


# What a cluster client's slot map may be stale after: a slot moved (resharding), or the
# node it names is gone (a failover).
STALE_MAP = (redis.exceptions.MovedError, redis.exceptions.AskError,
             redis.ConnectionError, redis.TimeoutError)  # fmt: skip


def refresh_after(client: RedisClient, error: BaseException) -> None:
    """After `error` on a connection made from a cluster client's slot map outside the
    client itself (per-node pipelines, probes, pubsub): read the map again, as the client
    does for its own commands."""
    if isinstance(client, RedisCluster) and isinstance(error, STALE_MAP):
        try:
            client.nodes_manager.initialize()
        except (redis.RedisError, RedisClusterException) as e:  # tried again next time
            log.info("cluster_map_not_refreshed", error=str(e))
        else:
            log.info("cluster_map_refreshed", after=type(error).__name__)

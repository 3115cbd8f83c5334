"""Connections to Redis: one client for a single Redis, the master Redis Sentinel names, or a
Redis Cluster, chosen by the scheme of REDIS_URL, and the plain clients of a cluster's
masters for work each node does.

`redis://`, `rediss://` and `unix://` name one Redis. A Sentinel URL,
`redis+sentinel://host1:26379,host2:26379/mymaster/0` (or `rediss+sentinel://` for TLS to
the Redis nodes), names the Sentinels watching service `mymaster`: redis-py's Sentinel client
asks them for the master on each new connection and so follows a failover.
`redis+cluster://host:port` (or `rediss+cluster://` for TLS) names any node of a Redis
Cluster: redis-py's cluster client learns the other nodes from it and sends each command to
the master holding its keys' slot. Credentials and query options are written as for
`redis://`.

The rule for a single Redis and a Sentinel master: a connection that met a failover (reset,
`READONLY` from a demoted primary, `LOADING` from a Redis still loading) is closed and the
command fails as a RedisError, not retried here: the caller's own backoff tries again, and
its next command connects afresh.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

import redis
import structlog
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import ReadOnlyError, RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from blackbox.errors import RedisUnreachable, SettingsError

log = structlog.get_logger("blackbox.storage.connections")

RedisClient: TypeAlias = redis.Redis | RedisCluster

# Each cluster scheme and the single-node scheme redis-py's cluster client reads in its place.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# Each Sentinel scheme and the single-node scheme its master's connections are read as.
SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
SENTINEL_PORT = 26379  # a Sentinel's port when its host is written without one
# Query options for the Sentinels themselves, and the connection argument each becomes;
# every other option is for the master's connections.
SENTINEL_OPTIONS = {"sentinel_username": "username", "sentinel_password": "password"}

MASK = "********"  # what a password is shown as
# The authority's password runs to its last "@" (a Sentinel URL lists several hosts after it).
_URL_PASSWORD = re.compile(r"(//[^/?#@:]*:)[^/?#]*@")
# password=, sentinel_password=, ssl_password=: every secret redis-py reads from the query (to
# its "&": a "#" in it is part of the secret as written).
_QUERY_PASSWORD = re.compile(r"([?&]\w*password=)[^&]*", re.IGNORECASE)


# What a URL whose credentials hold an unencoded delimiter is refused with.
PERCENT_ENCODE = (
    "a '#', '?' or '/' in its user name or password ends the host part early: percent-encode "
    "them (# as %23, ? as %3F, / as %2F, @ as %40)"
)


def mask_url(url: str) -> str:
    """The URL with any password (in the authority or the query) replaced by asterisks; in
    a URL whose credentials hold an unencoded delimiter, all that precedes its last "@"
    but the user name."""
    masked = _QUERY_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}", url)
    if unencoded_credentials(url) and "@" in masked:
        scheme, _, rest = masked.partition("://")
        written, _, after = rest.rpartition("@")
        user = f"{written.partition(':')[0]}:" if ":" in written else ""
        return f"{scheme}://{user}{MASK}@{after}"
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}@", masked)


def unencoded_credentials(url: str) -> bool:
    """Whether `url` holds an "@" where none belongs (its path, a query parameter's name,
    its fragment): credentials written with an unencoded "#", "?" or "/", which ended the
    authority before their "@". Split by hand: urlsplit refuses some such URLs ("[")."""
    _, _, rest = url.partition("://")
    ends = [i for i in map(rest.find, "/?#") if i >= 0]
    path_and_query, _, fragment = rest[min(ends, default=len(rest)) :].partition("#")
    path, _, query = path_and_query.partition("?")
    names = [pair.partition("=")[0] for pair in query.split("&")]
    return any("@" in part for part in (path, fragment, *names))


def is_cluster(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://` or `rediss+cluster://`)."""
    scheme, separator, _ = url.partition("://")
    return bool(separator) and scheme in CLUSTER_SCHEMES


def is_sentinel(url: str) -> bool:
    """Whether `url` names Sentinels (`redis+sentinel://` or `rediss+sentinel://`)."""
    scheme, separator, _ = url.partition("://")
    return bool(separator) and scheme in SENTINEL_SCHEMES


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
    """A client for the Redis, the Sentinels' master or the Redis Cluster that `url` names,
    failing fast when Redis is away so callers can back off; SettingsError naming REDIS_URL
    if the URL is malformed.

    A single Redis's client and a Sentinel master's connect on first use. The cluster
    client asks the node for the slot map at once: an unreachable cluster raises
    RedisUnreachable here. redis-py does not hand `health_check_interval` (nor unknown query
    options) to a cluster's node connections: it reconnects through its own retries instead.
    """
    if unencoded_credentials(url):  # parsed, it would connect elsewhere or print the secret
        raise bad_url(url, PERCENT_ENCODE)
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
    if is_sentinel(url):
        return sentinel_client(sentinel_target(url), options)
    try:
        return redis.Redis.from_url(url, **options, **drop_on_readonly())
    except ValueError as e:
        raise bad_url(url, e) from e


def drop_on_readonly() -> dict[str, Any]:
    """The retry arguments that make a single Redis's client close a connection answered
    `READONLY`, so the next command connects again (to the new primary, behind an endpoint
    that moved) instead of asking the demoted one forever.

    redis-py raises READONLY as a reply and keeps the connection; an error its retry
    handles closes the connection first. Zero retries: the caller's backoff tries again.
    """
    return {"retry": Retry(NoBackoff(), 0), "retry_on_error": [ReadOnlyError]}


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


@dataclass(frozen=True)
class SentinelTarget:
    """What a Sentinel URL names: the Sentinels to ask, the service they watch, and the
    arguments of the connections to its master and of those to the Sentinels."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    master: Mapping[str, Any]
    sentinel: Mapping[str, Any]


def sentinel_target(url: str) -> SentinelTarget:
    """The Sentinels, service, database, credentials and options written in the Sentinel URL
    `url`, read as redis-py reads a `redis://` URL; SettingsError naming REDIS_URL if the URL
    is malformed, before any connection is tried."""
    try:
        parts = urlsplit(url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        sentinels = tuple(sentinel_address(host) for host in hosts.split(","))
        service_name, db = service_and_db(parts.path)
        master = master_options(SENTINEL_SCHEMES[parts.scheme], userinfo, parts.query)
    except ValueError as e:
        raise bad_url(url, e) from e
    sentinel = {SENTINEL_OPTIONS[name]: master.pop(name) for name in SENTINEL_OPTIONS
                if name in master}  # fmt: skip
    return SentinelTarget(sentinels, service_name, {"db": db, **master}, sentinel)


def sentinel_address(written: str) -> tuple[str, int]:
    """(host, port) of one Sentinel written `host[:port]` in the URL; ValueError if it is
    no address."""
    parts = urlsplit(f"//{written}")
    if not parts.hostname:
        raise ValueError("a Sentinel URL names each Sentinel as host:port, comma-separated")
    return parts.hostname, SENTINEL_PORT if parts.port is None else parts.port


def service_and_db(path: str) -> tuple[str, int]:
    """The monitored service and the database written as a Sentinel URL's path
    (`/mymaster/0`; the database is 0 when left out)."""
    name, _, db = path.removeprefix("/").partition("/")
    if not name:
        raise ValueError("a Sentinel URL names the service the Sentinels watch: /mymaster/0")
    db = db.removesuffix("/")
    if db and not (db.isascii() and db.isdigit()):
        raise ValueError(f"the database {db!r} after the service name is not a number")
    return unquote(name), int(db or 0)


def master_options(scheme: str, userinfo: str, query: str) -> dict[str, Any]:
    """The master's credentials and query options (the Sentinels' too, still under their
    query names), read by redis-py's own parser; TLS as the `ssl` the Sentinel pool takes."""
    credentials = f"{userinfo}@" if userinfo else ""
    # parse_url wants a host: a placeholder, dropped, since the Sentinels name the master.
    options: dict[str, Any] = parse_url(f"{scheme}://{credentials}master?{query}")  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    for name in ("host", "port", "connection_class"):
        options.pop(name, None)
    return {**options, "ssl": scheme == "rediss"}


class SentinelMaster(redis.Redis):
    """The client of the master the Sentinels name (redis-py's `master_for`): each new
    connection asks them for the master, and a connection answered `READONLY` is closed.
    Closing this client also closes its connections to the Sentinels."""

    def close(self) -> None:
        super().close()
        pool = self.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            pool.sentinel_manager.close()


def sentinel_client(target: SentinelTarget, options: Mapping[str, Any]) -> redis.Redis:
    """The client of the master of `target`, with `options` (the service's timeouts) unless
    the URL sets them; the Sentinels are asked with the same socket timeouts, once each."""
    master = {**options, **target.master}
    sockets = {name: value for name, value in master.items() if name.startswith("socket_")}
    # Without it redis-py tries a Sentinel that is away 11 times with backoff (4 s when
    # refused, measured; 11 connect timeouts more when unanswered) before the next one.
    once = {"retry": Retry(NoBackoff(), 0)}
    asked = {**sockets, **once, **target.sentinel}
    sentinels = Sentinel(list(target.sentinels), sentinel_kwargs=asked)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    client: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call]  # unannotated
        target.service_name, redis_class=SentinelMaster, **master
    )
    return client


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

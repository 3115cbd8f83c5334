"""REDIS_URL's schemes: which make a single-Redis client, which a Sentinel master's client and
which a Redis Cluster client, how passwords are masked, and which URLs are refused before any
connection is tried. No process is started."""

from __future__ import annotations

import pytest
import redis
from redis.connection import Connection
from redis.exceptions import ReadOnlyError
from redis.sentinel import (
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from blackbox.errors import RedisUnreachable, SettingsError
from blackbox.storage import connections
from blackbox.storage.connections import mask_url


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://127.0.0.1:7000",
        "rediss+cluster://user:pw@redis.example:6380/0?ssl_cert_reqs=none",
    ],
)
def test_cluster_schemes_name_a_cluster(url: str) -> None:
    """`redis+cluster://` and `rediss+cluster://` select the cluster client."""
    assert connections.is_cluster(url)


@pytest.mark.parametrize(
    "url",
    ["redis://localhost:6379/0", "rediss://localhost:6380/0", "unix:///run/redis.sock",
     "redis+cluster", "cluster://host:1", ""],
)  # fmt: skip
def test_other_urls_name_one_redis(url: str) -> None:
    """Every other URL (and anything without a scheme) is left to the single-Redis client."""
    assert not connections.is_cluster(url)


def test_node_url_keeps_address_credentials_and_options() -> None:
    """The cluster URL reaches redis-py as its node's URL with nothing but the scheme changed."""
    url = "rediss+cluster://user:s%40cret@node-1:7000/0?ssl_cert_reqs=none"
    assert connections.node_url(url) == "rediss://user:s%40cret@node-1:7000/0?ssl_cert_reqs=none"


def test_plain_url_makes_a_client_with_the_service_timeouts() -> None:
    """A `redis://` URL gives redis.Redis with the fail-fast timeouts, connecting on first use."""
    client = connections.redis_client("redis://:pw@127.0.0.1:1/3", socket_timeout=1.5)
    assert type(client) is redis.Redis
    options = client.connection_pool.connection_kwargs
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (1.5, 2.0)
    assert (options["health_check_interval"], options["db"], options["password"]) == (10, 3, "pw")


def test_a_single_redis_is_its_own_only_primary() -> None:
    """primaries() of a single-Redis client is that client, so per-node work runs once."""
    client = redis.Redis.from_url("redis://127.0.0.1:1/0")
    assert connections.primaries(client) == [client]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://:hunter22@127.0.0.1:6379/0", "schemes"),
        ("redis://:hunter22@127.0.0.1:6379/0?socket_timeout=soon", "socket_timeout"),
        ("redis+cluster://:hunter22@127.0.0.1:6379/1", "only database 0"),
        ("redis+cluster://:hunter22@127.0.0.1:99999", "Port"),
        ("redis+cluster://:hunter22@/0", "host:port"),
        ("rediss+cluster://:hunter22@127.0.0.1:7000?socket_timeout=soon", "socket_timeout"),
    ],
)
def test_bad_url_is_a_settings_error_naming_redis_url(url: str, reason: str) -> None:
    """A malformed URL stops the start with SettingsError naming REDIS_URL and why, its
    password masked; a cluster URL is refused before the client tries to connect."""
    with pytest.raises(SettingsError, match=reason) as raised:
        connections.redis_client(url)
    assert str(raised.value).startswith("REDIS_URL=")
    assert "hunter22" not in str(raised.value)


def test_cluster_url_options_are_read_as_redis_py_reads_a_node_url() -> None:
    """A cluster URL's node, credentials and query options reach the cluster client as
    redis-py would read them from `redis://`; `rediss+cluster://` turns TLS on."""
    url = "rediss+cluster://app:s%40cret@node-1:7000/0?ssl_cert_reqs=none&socket_timeout=0.5"
    assert connections.cluster_options(url) == {
        "host": "node-1", "port": 7000, "db": 0, "username": "app", "password": "s@cret",
        "ssl": True, "ssl_cert_reqs": "none", "socket_timeout": 0.5,
    }  # fmt: skip
    assert connections.cluster_options("redis+cluster://node-2:7001")["ssl"] is False


def test_an_unreachable_cluster_is_named_with_its_password_masked() -> None:
    """Guarantee 5: a cluster client cannot be built without a node answering; the error
    says which cluster (password masked), so `blackbox run` can log it and try again."""
    with pytest.raises(RedisUnreachable, match=r"127\.0\.0\.1:1") as caught:
        connections.redis_client("redis+cluster://:secret@127.0.0.1:1", connect_timeout=0.5)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:pw@cache:6379/0", "redis://:********@cache:6379/0"),
        ("rediss://user:pw@cache/0", "rediss://user:********@cache/0"),
        ("redis://user:p%40ss@cache:6379", "redis://user:********@cache:6379"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("redis://user@cache:6379/0", "redis://user@cache:6379/0"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    """mask_url replaces the password of a URL and leaves URLs without one unchanged."""
    assert mask_url(url) == masked


def test_mask_url_masks_a_password_given_as_a_query_parameter() -> None:
    """redis-py also reads ?password=: it is masked, and the other parameters are kept."""
    url = "redis://cache:6379/0?db=1&password=hunter2&ssl=true"
    assert mask_url(url) == "redis://cache:6379/0?db=1&password=********&ssl=true"


@pytest.mark.parametrize(
    "url", ["redis+sentinel://127.0.0.1:26379/mymaster/0", "rediss+sentinel://s1,s2/mymaster"]
)
def test_sentinel_schemes_name_sentinels_not_a_cluster(url: str) -> None:
    """`redis+sentinel://` and `rediss+sentinel://` select the Sentinel client, never the
    cluster client."""
    assert connections.is_sentinel(url)
    assert not connections.is_cluster(url)


@pytest.mark.parametrize(
    "url", ["redis://localhost:6379/0", "redis+cluster://h:7000", "sentinel://h/m", ""]
)
def test_other_urls_name_no_sentinel(url: str) -> None:
    """Single-Redis, cluster and scheme-less URLs are not read as Sentinel URLs."""
    assert not connections.is_sentinel(url)


def test_sentinel_url_names_each_sentinel_the_service_and_the_database() -> None:
    """Every comma-separated host is a Sentinel (port 26379 when none is written, IPv6 in
    brackets); the path names the monitored service, then the database."""
    url = "redis+sentinel://s1:26380,s2,[::1]:26381/my%20master/2"
    target = connections.sentinel_target(url)
    assert target.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (target.service_name, target.master["db"]) == ("my master", 2)


@pytest.mark.parametrize("path", ["/mymaster", "/mymaster/"])
def test_sentinel_url_without_a_database_means_database_0(path: str) -> None:
    """A Sentinel URL may leave the database out: it is 0, as for `redis://`."""
    assert connections.sentinel_target(f"redis+sentinel://s1{path}").master["db"] == 0


def test_sentinel_url_passwords_go_to_the_master_and_to_the_sentinels_apart() -> None:
    """The authority's credentials are the Redis master's; `sentinel_username` and
    `sentinel_password` in the query are the Sentinels' own, and never reach the master."""
    url = ("redis+sentinel://app:s%40cret@s1:26379,s2:26379/mymaster/0"
           "?sentinel_username=watcher&sentinel_password=w%26tch")  # fmt: skip
    target = connections.sentinel_target(url)
    assert (target.master["username"], target.master["password"]) == ("app", "s@cret")
    assert target.sentinel == {"username": "watcher", "password": "w&tch"}
    assert not any(name.startswith("sentinel_") for name in target.master)


def test_sentinel_url_query_options_are_read_as_redis_py_reads_them() -> None:
    """Query options reach the master's connections parsed as redis-py parses them for
    `redis://` (a number for socket_timeout); a `?db=` wins over the path, as there."""
    url = "redis+sentinel://s1/mymaster/1?socket_timeout=0.5&db=3&client_name=bb"
    master = connections.sentinel_target(url).master
    assert (master["socket_timeout"], master["db"], master["client_name"]) == (0.5, 3, "bb")
    assert master["ssl"] is False


def test_rediss_sentinel_turns_tls_on_for_the_redis_nodes() -> None:
    """`rediss+sentinel://` makes the master's connections TLS, with the URL's ssl options."""
    client = connections.redis_client("rediss+sentinel://s1/mymaster/0?ssl_cert_reqs=none")
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"
    assert "ssl" not in pool.connection_kwargs


def test_sentinel_url_makes_a_master_client_with_the_service_timeouts() -> None:
    """A Sentinel URL gives a redis.Redis of the service's master, connecting on first use
    through a pool that asks the Sentinels (each once, with the same timeouts and their own
    password) for the master; no process is started."""
    url = "redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/mymaster/3?sentinel_password=sp"
    client = connections.redis_client(url, socket_timeout=1.5)
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert (pool.service_name, pool.connection_class) == ("mymaster", SentinelManagedConnection)
    options = pool.connection_kwargs
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (1.5, 2.0)
    assert (options["health_check_interval"], options["db"], options["password"]) == (10, 3, "pw")
    asked = [sentinel.connection_pool.connection_kwargs
             for sentinel in pool.sentinel_manager.sentinels]  # fmt: skip
    assert [(kw["host"], kw["port"], kw["password"]) for kw in asked] == [
        ("127.0.0.1", 1, "sp"), ("127.0.0.1", 2, "sp")]  # fmt: skip
    assert all(kw["socket_timeout"] == 1.5 and kw["retry"].get_retries() == 0 for kw in asked)
    client.close()


def test_plain_client_drops_a_connection_answered_readonly() -> None:
    """A demoted primary's READONLY goes to the failure handler that closes the connection
    (so the next command connects afresh) and is raised at once, never retried here."""
    client = connections.redis_client("redis://127.0.0.1:1/0")
    assert isinstance(client, redis.Redis)
    connection = client.connection_pool.make_connection()
    assert isinstance(connection, Connection)
    retry = connection.retry
    handled: list[Exception] = []

    def answer_readonly() -> None:
        raise ReadOnlyError("You can't write against a read only replica.")

    with pytest.raises(ReadOnlyError):
        retry.call_with_retry(answer_readonly, handled.append)
    assert len(handled) == 1


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel://:hunter22@/mymaster/0", "host:port"),
        ("redis+sentinel://:hunter22@s1,,s2/mymaster/0", "host:port"),
        ("redis+sentinel://:hunter22@s1:26379", "service"),
        ("redis+sentinel://:hunter22@s1:26379/", "service"),
        ("redis+sentinel://:hunter22@s1:26379/mymaster/zero", "not a number"),
        ("redis+sentinel://:hunter22@s1:26379/mymaster/0/1", "not a number"),
        ("redis+sentinel://:hunter22@s1:99999/mymaster/0", "Port out of range"),
        ("redis+sentinel://:hunter22@s1:port/mymaster/0", "Port"),
        ("rediss+sentinel://:hunter22@s1/mymaster/0?socket_timeout=soon", "socket_timeout"),
    ],
)
def test_bad_sentinel_url_is_a_settings_error_naming_redis_url(url: str, reason: str) -> None:
    """A malformed Sentinel URL (no Sentinel, no service, a database or port that is no
    number) stops the start with SettingsError naming REDIS_URL and why, its password
    masked, before any Sentinel is asked."""
    with pytest.raises(SettingsError, match=reason) as raised:
        connections.redis_client(url)
    assert str(raised.value).startswith("REDIS_URL=")
    assert "hunter22" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis+sentinel://:pw@s1:26379,s2:26379/mymaster/0",
         "redis+sentinel://:********@s1:26379,s2:26379/mymaster/0"),
        ("rediss+sentinel://app:p@ss@s1,s2/mymaster",
         "rediss+sentinel://app:********@s1,s2/mymaster"),
        ("redis+sentinel://s1:26379,s2:26379/mymaster/0",
         "redis+sentinel://s1:26379,s2:26379/mymaster/0"),
        ("redis+sentinel://s1,s2/mymaster/0?sentinel_password=spw&db=1",
         "redis+sentinel://s1,s2/mymaster/0?sentinel_password=********&db=1"),
        ("redis+sentinel://:pw@s1/m?socket_timeout=1&sentinel_password=spw",
         "redis+sentinel://:********@s1/m?socket_timeout=1&sentinel_password=********"),
    ],
)  # fmt: skip
def test_mask_url_masks_sentinel_urls(url: str, masked: str) -> None:
    """mask_url hides the master's password before a list of Sentinel hosts (even one with
    an unescaped "@") and the Sentinels' own `sentinel_password=` in the query."""
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    "url",
    [
        "redis://app:hunter#22@cache:6379/0",
        "redis://:hunter?22@cache:6379/0",
        "redis://:hunter/22@cache:6379/0",
        "rediss://app:se/hunter22@cache/0",
        "redis+cluster://:hunter/22@node-1:7000",
        "redis+cluster://:hunter#22@node-1:7000",
        "redis+sentinel://:hunter#22@s1:26379/mymaster/0",
        "redis+sentinel://:hunter/22@s1:26379,s2/mymaster/0",
        "redis+sentinel://:hunter?22@s1/mymaster/0",
        "redis://cache:6379/0?password=hunter#22@x",
        "redis://:hunter[22/x@cache:6379/0",
    ],
)
def test_a_password_with_an_unencoded_delimiter_is_never_printed(url: str) -> None:
    """A password holding an unencoded "#", "?" or "/" ends the URL's host part early, so the
    URL is refused: the error names REDIS_URL, prints no part of the password, and tells the
    user to percent-encode it; mask_url hides it as well."""
    with pytest.raises(SettingsError, match="percent-encode") as raised:
        connections.redis_client(url)
    message = str(raised.value)
    assert message.startswith("REDIS_URL=")
    assert "hunter" not in message and "22" not in message, message
    assert "hunter" not in mask_url(url) and "22" not in mask_url(url)


def test_mask_url_masks_a_query_password_holding_a_hash() -> None:
    """A `#` in a query password would end the query: the whole value is masked."""
    url = "redis://cache:6379/0?password=hunter#22&db=1"
    assert mask_url(url) == "redis://cache:6379/0?password=********&db=1"

"""REDIS_URL's schemes: which make a single-Redis client and which a Redis Cluster client, and
which are refused before any connection is tried. No process is started."""

from __future__ import annotations

import pytest
import redis

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

"""Settings.from_env: defaults, errors that name the variable, KAFKA_* passthrough, masked repr."""

from __future__ import annotations

import pytest

from blackbox import settings
from blackbox.errors import SettingsError
from blackbox.settings import VARIABLES, Settings


def test_defaults_from_an_empty_environment() -> None:
    """An empty environment yields the documented defaults for every setting."""
    loaded = Settings.from_env({})
    assert loaded == Settings(
        redis_url="redis://localhost:6379/0",
        accept_eviction=False,
        namespace="bb",
        shards=None,
        reread_limit=100_000,
        redis_max_lag=60.0,
        redis_loss="stop",
        intake_topic="blackbox",
        group_id="blackbox",
        dlq_topic="blackbox.dlq",
        events_topic="blackbox.events",
        store_topic="",
        storage_mode="inline",
        store_cache_mb=256,
        policy_file="",
        poll_interval=1.0,
        batch_limit=1000,
        batch_bytes=16_777_216,
        intake_batch=500,
        intake_window_ms=25,
        fire_ahead_ms=100,
        fire_coalesce_ms=3,
        lease_seconds=30.0,
        delivery_timeout=10.0,
        max_attempts=5,
        retry_backoff=1.0,
        retry_backoff_max=60.0,
        grace_seconds=604_800,
        max_message_bytes=1_048_576,
        max_countdown=315_576_000.0,
        fired_retention=86_400,
        http_host="0.0.0.0",  # noqa: S104
        http_port=8080,
        probe_port=None,
        http_header_timeout=10.0,
        http_body_timeout=30.0,
        http_max_connections=1000,
        http_answer_timeout=30.0,
        http_max_connections_per_client=100,
        api_token="",
        api_tokens_file="",
        api_signing_key_file="",
        api_key_id="blackbox-api",
        api_reads="token",
        api_dev_open=False,
        api_allowed_hosts=(),
        health_interval=2.0,
        log_format="auto",
        log_level="info",
        kafka={"bootstrap.servers": "localhost:9092"},
        kafka_consumer={},
        kafka_producer={},
    )


def test_every_variable_default_is_valid() -> None:
    """Each Var's default string parses, so the defaults table cannot drift from its parsers."""
    for var in VARIABLES:
        assert var.parse(var.default) == getattr(Settings.from_env({}), var.attribute)


def test_values_are_read_typed_and_stripped() -> None:
    """Variables are parsed to their types, surrounding whitespace ignored."""
    loaded = Settings.from_env(
        {
            "BLACKBOX_POLL_INTERVAL": " 0.25 ",
            "BLACKBOX_BATCH_LIMIT": "7\n",
            "BLACKBOX_LOG_FORMAT": "json",
            "BLACKBOX_INTAKE_TOPIC": "schedules",
            "REDIS_URL": "redis://cache:6380/2",
        }
    )
    assert loaded.poll_interval == 0.25
    assert loaded.batch_limit == 7
    assert loaded.log_format == "json"
    assert loaded.intake_topic == "schedules"
    assert loaded.redis_url == "redis://cache:6380/2"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BLACKBOX_POLL_INTERVAL", "0"),
        ("BLACKBOX_POLL_INTERVAL", "abc"),
        ("BLACKBOX_POLL_INTERVAL", "-1"),
        ("BLACKBOX_POLL_INTERVAL", "nan"),
        ("BLACKBOX_POLL_INTERVAL", "inf"),
        ("BLACKBOX_POLL_INTERVAL", ""),
        ("BLACKBOX_BATCH_LIMIT", "-1"),
        ("BLACKBOX_BATCH_LIMIT", "0"),
        ("BLACKBOX_BATCH_LIMIT", "1.5"),
        ("BLACKBOX_BATCH_LIMIT", "many"),
        ("BLACKBOX_BATCH_LIMIT", "10001"),
        ("BLACKBOX_INTAKE_BATCH", "100000"),
        ("BLACKBOX_INTAKE_BATCH", "0"),
        ("BLACKBOX_INTAKE_WINDOW_MS", "-1"),
        ("BLACKBOX_INTAKE_WINDOW_MS", "2.5"),
        ("BLACKBOX_FIRE_AHEAD_MS", "1001"),
        ("BLACKBOX_FIRE_AHEAD_MS", ""),
        ("BLACKBOX_FIRE_COALESCE_MS", "-1"),
        ("BLACKBOX_FIRE_COALESCE_MS", "1001"),
        ("BLACKBOX_LEASE_SECONDS", "0"),
        ("BLACKBOX_DELIVERY_TIMEOUT", "-5"),
        ("BLACKBOX_MAX_ATTEMPTS", "0"),
        ("BLACKBOX_RETRY_BACKOFF", "soon"),
        ("BLACKBOX_RETRY_BACKOFF_MAX", "0"),
        ("BLACKBOX_GRACE_SECONDS", "1e3"),
        ("BLACKBOX_MAX_MESSAGE_BYTES", "0"),
        ("BLACKBOX_MAX_COUNTDOWN", "-1"),
        ("BLACKBOX_LOG_FORMAT", "xml"),
        ("BLACKBOX_LOG_FORMAT", "JSON"),
        ("BLACKBOX_LOG_LEVEL", "trace"),
        ("BLACKBOX_INTAKE_TOPIC", ""),
        ("BLACKBOX_INTAKE_TOPIC", "__consumer_offsets"),
        ("BLACKBOX_DLQ_TOPIC", "  "),
        ("BLACKBOX_DLQ_TOPIC", "__dlq"),
        ("BLACKBOX_ACCEPT_EVICTION", "maybe"),
        ("BLACKBOX_ACCEPT_EVICTION", ""),
    ],
)
def test_bad_variable_is_named(name: str, value: str) -> None:
    """A malformed variable raises SettingsError whose message names it and its value."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({name: value})
    message = str(caught.value)
    assert message.startswith(f"{name}={value.strip()!r} is invalid: ")
    assert isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize(
    ("value", "accepted"),
    [("true", True), ("YES", True), ("1", True), ("false", False), ("no", False), ("0", False)],
)
def test_accepting_eviction_is_an_explicit_flag(value: str, accepted: bool) -> None:
    """Running on an evicting Redis takes a deliberate true/false, nothing looser."""
    assert Settings.from_env({"BLACKBOX_ACCEPT_EVICTION": value}).accept_eviction is accepted


def test_empty_namespace_is_refused() -> None:
    """Convention 3: an empty BLACKBOX_NAMESPACE (hash tag `{}`) would split keys across slots."""
    with pytest.raises(SettingsError, match="BLACKBOX_NAMESPACE"):
        Settings.from_env({"BLACKBOX_NAMESPACE": ""})


@pytest.mark.parametrize(("timeout", "lease"), [("30", "30"), ("31", "30"), ("10", "5")])
def test_delivery_timeout_must_be_shorter_than_lease(timeout: str, lease: str) -> None:
    """Guarantee 3: a delivery timeout >= the lease is refused (a slow delivery fires twice)."""
    environ = {"BLACKBOX_DELIVERY_TIMEOUT": timeout, "BLACKBOX_LEASE_SECONDS": lease}
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(environ)
    assert "BLACKBOX_DELIVERY_TIMEOUT" in str(caught.value)
    assert "BLACKBOX_LEASE_SECONDS" in str(caught.value)


def test_delivery_timeout_just_under_lease_is_accepted() -> None:
    """A lease just longer than the delivery timeout, the wait for its reports (1 s), the
    sweep delay (2 s at least) and the margin (1 s) is accepted."""
    loaded = Settings.from_env(
        {"BLACKBOX_DELIVERY_TIMEOUT": "25.9", "BLACKBOX_LEASE_SECONDS": "30"}
    )
    assert (loaded.delivery_timeout, loaded.lease_seconds) == (25.9, 30.0)


@pytest.mark.parametrize(
    ("poll", "timeout", "lease"),
    [("15", "10", "30"), ("1", "10", "14"), ("0.1", "2", "6"), ("60", "1", "100")],
    ids=["poll 15 s on the default lease", "lease = timeout + 4", "chaos settings of old",
         "sweep delay 120 s"],
)  # fmt: skip
def test_a_lease_shorter_than_delivery_and_sweep_is_refused(
    poll: str, timeout: str, lease: str
) -> None:
    """Guarantee 3: a lease no longer than the delivery timeout + 1 s + the sweep delay
    (2 poll intervals, at least 2 s) + 1 s is refused at start, naming the variables: with
    a poll interval of 15 s the default lease of 30 s would run out under a sweep's claim."""
    environ = {"BLACKBOX_POLL_INTERVAL": poll, "BLACKBOX_DELIVERY_TIMEOUT": timeout,
               "BLACKBOX_LEASE_SECONDS": lease}  # fmt: skip
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(environ)
    for name in ("BLACKBOX_LEASE_SECONDS", "BLACKBOX_DELIVERY_TIMEOUT", "BLACKBOX_POLL_INTERVAL"):
        assert name in str(caught.value)


def test_an_unset_shard_count_is_none_and_an_empty_one_too() -> None:
    """BLACKBOX_SHARDS unset or empty (the chart's default) leaves the count to the
    namespace (layout.adopt); a number is taken as it is."""
    assert Settings.from_env({}).shards is None
    assert Settings.from_env({"BLACKBOX_SHARDS": ""}).shards is None
    assert Settings.from_env({"BLACKBOX_SHARDS": "1"}).shards == 1


def test_dlq_topic_must_differ_from_intake_topic() -> None:
    """Guarantee 4: dead letters may not land back on the intake topic."""
    environ = {"BLACKBOX_INTAKE_TOPIC": "jobs", "BLACKBOX_DLQ_TOPIC": "jobs"}
    with pytest.raises(SettingsError, match="BLACKBOX_DLQ_TOPIC"):
        Settings.from_env(environ)


def test_kafka_properties_pass_through() -> None:
    """KAFKA_X_Y=v sets the librdkafka property x.y=v for every client."""
    loaded = Settings.from_env(
        {
            "KAFKA_SASL_MECHANISM": "PLAIN",
            "KAFKA_BOOTSTRAP_SERVERS": "broker:9093",
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        }
    )
    assert loaded.kafka == {
        "bootstrap.servers": "broker:9093",
        "sasl.mechanism": "PLAIN",
        "security.protocol": "SASL_SSL",
    }


def test_client_properties_go_only_to_their_client() -> None:
    """KAFKA_CONSUMER_*/KAFKA_PRODUCER_* reach only that client, never the shared map."""
    loaded = Settings.from_env(
        {
            "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000",
            "KAFKA_PRODUCER_LINGER_MS": "5",
            "KAFKA_CLIENT_ID": "bb",
        }
    )
    assert loaded.kafka == {"bootstrap.servers": "localhost:9092", "client.id": "bb"}
    assert loaded.kafka_consumer == {"session.timeout.ms": "6000"}
    assert loaded.kafka_producer == {"linger.ms": "5"}


def test_unrelated_and_bare_prefix_variables_are_ignored() -> None:
    """Variables without a property after the KAFKA_ prefix, and non-KAFKA ones, are ignored."""
    environ = {"KAFKA_": "x", "KAFKA_CONSUMER_": "x", "KAFKA_PRODUCER_": "x", "PATH": "/bin"}
    loaded = Settings.from_env(environ)
    assert loaded.kafka == {"bootstrap.servers": "localhost:9092"}
    assert loaded.kafka_consumer == {}
    assert loaded.kafka_producer == {}


def test_kafka_variable_inverts_the_passthrough() -> None:
    """kafka_variable names the variable that kafka_config reads a property from."""
    name = settings.kafka_variable("sasl.mechanism")
    assert name == "KAFKA_SASL_MECHANISM"
    assert settings.kafka_config({name: "SCRAM-SHA-512"})["sasl.mechanism"] == "SCRAM-SHA-512"


SECRETS = {
    "REDIS_URL": "redis://app:hunter2-redis@cache:6380/1",
    "KAFKA_SASL_USERNAME": "svc-user",
    "KAFKA_SASL_PASSWORD": "hunter2-sasl",
    "KAFKA_SSL_KEY_PASSWORD": "hunter2-key",
    "KAFKA_CONSUMER_SASL_OAUTHBEARER_CLIENT_SECRET": "hunter2-oauth",
    "KAFKA_PRODUCER_SASL_PASSWORD": "hunter2-producer",
}


def test_repr_masks_secrets() -> None:
    """No password or secret reaches repr: the Redis URL and secret kafka properties are masked."""
    shown = repr(Settings.from_env(SECRETS))
    assert "hunter2" not in shown
    assert "'redis://app:********@cache:6380/1'" in shown
    assert "'sasl.password': '********'" in shown
    assert "'ssl.key.password': '********'" in shown
    assert "'sasl.oauthbearer.client.secret': '********'" in shown
    assert "'sasl.username': 'svc-user'" in shown


def test_repr_keeps_the_values_themselves() -> None:
    """Masking only changes repr: the settings still hold the real secrets for the clients."""
    loaded = Settings.from_env(SECRETS)
    assert loaded.redis_url == SECRETS["REDIS_URL"]
    assert loaded.kafka["sasl.password"] == "hunter2-sasl"
    assert loaded.kafka_producer["sasl.password"] == "hunter2-producer"


def test_describe_lists_every_variable() -> None:
    """`blackbox run --help` documents every variable with its default."""
    text = settings.describe()
    for var in VARIABLES:
        line = next(row for row in text.splitlines() if row.strip().startswith(var.name + " "))
        assert f"(default: {var.default})" in line
    for prefix in ("KAFKA_*", "KAFKA_CONSUMER_*", "KAFKA_PRODUCER_*"):
        assert prefix in text


def test_settings_are_frozen() -> None:
    """Settings cannot change after validation."""
    loaded = Settings.from_env({})
    with pytest.raises(AttributeError):
        loaded.batch_limit = 5  # type: ignore[misc]


def test_api_token_is_masked_and_checked() -> None:
    """The API token never shows in repr, and a short one is refused naming the variable."""
    token = "s3cret-token-of-32-characters-xx"  # noqa: S105 - a test token
    loaded = Settings.from_env({"BLACKBOX_API_TOKEN": token, "BLACKBOX_API_DEV_OPEN": "true"})
    assert loaded.api_token == token
    assert loaded.api_dev_open is True
    assert token not in repr(loaded)
    with pytest.raises(SettingsError, match="BLACKBOX_API_TOKEN"):
        Settings.from_env({"BLACKBOX_API_TOKEN": "short"})
    with pytest.raises(SettingsError, match="BLACKBOX_API_READS"):
        Settings.from_env({"BLACKBOX_API_READS": "maybe"})
    with pytest.raises(SettingsError, match="BLACKBOX_API_DEV_OPEN"):
        Settings.from_env({"BLACKBOX_API_DEV_OPEN": "yes please"})


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("BLACKBOX_HTTP_PORT", "0", 0),
        ("BLACKBOX_HTTP_PORT", "65535", 65535),
        ("BLACKBOX_HTTP_PORT", "off", None),
        ("BLACKBOX_MAX_ATTEMPTS", "1", 1),
        ("BLACKBOX_BATCH_LIMIT", "10000", 10_000),
        ("BLACKBOX_MAX_COUNTDOWN", "31557600000", 31_557_600_000.0),
        ("BLACKBOX_DELIVERY_TIMEOUT", "0.01", 0.01),
        ("BLACKBOX_POLL_INTERVAL", "0.001", 0.001),
        ("BLACKBOX_INTAKE_WINDOW_MS", "0", 0),
        ("BLACKBOX_FIRE_AHEAD_MS", "1000", 1000),
        ("BLACKBOX_FIRE_COALESCE_MS", "0", 0),
    ],
)
def test_the_edges_of_each_range_are_accepted(name: str, value: str, expected: object) -> None:
    """The documented limits are inclusive: port 0-65535, batch up to 10,000, 1,000 years."""
    (var,) = (v for v in VARIABLES if v.name == name)
    assert getattr(Settings.from_env({name: value}), var.attribute) == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BLACKBOX_HTTP_PORT", "65536"),
        ("BLACKBOX_HTTP_PORT", "-1"),
        ("BLACKBOX_HTTP_PORT", "OFF"),
        ("BLACKBOX_MAX_COUNTDOWN", "31557600001"),
        ("BLACKBOX_DELIVERY_TIMEOUT", "0.009"),
        ("BLACKBOX_NAMESPACE", "a{b"),
        ("BLACKBOX_NAMESPACE", "a}b"),
        ("BLACKBOX_NAMESPACE", "bb#0"),  # would be shard 0's tag of namespace bb
        ("BLACKBOX_SHARDS", "0"),
        ("BLACKBOX_SHARDS", "1025"),
    ],
)
def test_one_step_past_each_range_is_refused(name: str, value: str) -> None:
    """One past each documented limit, or a brace or '#' in the namespace (its hash tag,
    and its shards'), is refused."""
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def _service_environment(name: str, ip: str, port: int) -> dict[str, str]:
    """What Kubernetes injects into every pod of a namespace for a Service called `name`."""
    prefix = name.upper().replace("-", "_")
    url = f"tcp://{ip}:{port}"
    return {
        f"{prefix}_SERVICE_HOST": ip,
        f"{prefix}_SERVICE_PORT": str(port),
        f"{prefix}_SERVICE_PORT_CLIENT": str(port),
        f"{prefix}_PORT": url,
        f"{prefix}_PORT_{port}_TCP": url,
        f"{prefix}_PORT_{port}_TCP_PROTO": "tcp",
        f"{prefix}_PORT_{port}_TCP_PORT": str(port),
        f"{prefix}_PORT_{port}_TCP_ADDR": ip,
    }


def test_a_kafka_service_in_the_namespace_reaches_no_client() -> None:
    """Guarantee 4: the variables of a Service named `kafka` (and `kafka-consumer`,
    `kafka-producer`) are not librdkafka properties; the operator's own ones still are."""
    environ = {
        **_service_environment("kafka", "10.0.0.7", 9092),
        **_service_environment("kafka-consumer", "10.0.0.8", 9092),
        **_service_environment("kafka-producer", "10.0.0.9", 9092),
        "KAFKA_BOOTSTRAP_SERVERS": "kafka:9092",
        "KAFKA_CONSUMER_FETCH_WAIT_MAX_MS": "20",
    }
    loaded = Settings.from_env(environ)
    assert loaded.kafka == {"bootstrap.servers": "kafka:9092"}
    assert loaded.kafka_consumer == {"fetch.wait.max.ms": "20"}
    assert loaded.kafka_producer == {}
    assert settings.service_links(environ) == frozenset(
        k
        for k in environ
        if k not in ("KAFKA_BOOTSTRAP_SERVERS", "KAFKA_CONSUMER_FETCH_WAIT_MAX_MS")
    )


def test_a_service_named_like_a_setting_does_not_break_the_start() -> None:
    """Guarantee 4: a Service `blackbox-http` injects BLACKBOX_HTTP_PORT=tcp://…, which is
    ignored; an explicit BLACKBOX_HTTP_PORT=8081 beside the same Service is kept."""
    injected = _service_environment("blackbox-http", "10.0.0.5", 8080)
    assert Settings.from_env(injected).http_port == 8080
    explicit = {**injected, "BLACKBOX_HTTP_PORT": "8081"}
    assert Settings.from_env(explicit).http_port == 8081
    assert "BLACKBOX_HTTP_PORT" not in settings.service_links(explicit)


def test_a_docker_links_variables_are_ignored_too() -> None:
    """Guarantee 4: a legacy Docker link to a container named kafka adds KAFKA_NAME and a
    KAFKA_ENV_* per variable of that container: none reaches librdkafka."""
    link = {"KAFKA_PORT": "tcp://172.17.0.2:9092", "KAFKA_NAME": "/app/kafka",
            "KAFKA_ENV_KAFKA_CFG_NODE_ID": "0",
            "KAFKA_PORT_9092_TCP_ADDR": "172.17.0.2"}  # fmt: skip
    assert settings.service_links(link) == frozenset(link)
    assert Settings.from_env(link).kafka == {"bootstrap.servers": "localhost:9092"}


def test_link_shaped_names_without_a_service_are_kept() -> None:
    """Only a Service that is there makes its variables links: KAFKA_PORT_1_TCP_ADDR alone
    (no KAFKA_SERVICE_HOST, no KAFKA_PORT URL) is passed on and refused by librdkafka."""
    assert (
        settings.service_links({"KAFKA_PORT_1_TCP_ADDR": "x", "KAFKA_ACKS": "all"}) == frozenset()
    )
    docker_link = {"KAFKA_PORT": "tcp://172.17.0.2:9092", "KAFKA_PORT_9092_TCP_ADDR": "172.17.0.2"}
    assert settings.service_links(docker_link) == frozenset(docker_link)


def test_allowed_hosts_are_names_wildcards_or_addresses() -> None:
    """BLACKBOX_API_ALLOWED_HOSTS (guarantee 4: the open API answers only the names it
    serves) is a comma-separated list of names, *.domain, IP addresses or *, lower-cased;
    anything else (a URL, a port, a misplaced wildcard) is refused naming the variable."""
    given = " Blackbox.Example.com, *.corp.example ,[::1],10.0.0.7,"
    loaded = Settings.from_env({"BLACKBOX_API_ALLOWED_HOSTS": given})
    assert loaded.api_allowed_hosts == ("blackbox.example.com", "*.corp.example", "[::1]",
                                        "10.0.0.7")  # fmt: skip
    for bad in ("http://blackbox", "blackbox:8080", "x.*.example", "a b"):
        with pytest.raises(SettingsError, match="BLACKBOX_API_ALLOWED_HOSTS"):
            Settings.from_env({"BLACKBOX_API_ALLOWED_HOSTS": bad})

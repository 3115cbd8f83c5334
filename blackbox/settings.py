"""One typed, frozen Settings object, read from the environment once at the entry point.

Every error names the variable at fault. Any librdkafka property can be passed as an
environment variable: `KAFKA_` + the property name in upper case with dots as underscores
(`KAFKA_SASL_MECHANISM=PLAIN` sets `sasl.mechanism`); secrets are masked in `repr`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from blackbox.envelope import ABSOLUTE_MAX_COUNTDOWN_SECONDS
from blackbox.errors import SettingsError
from blackbox.storage.connections import MASK, mask_url
from blackbox.storage.keys import MAX_SHARDS, SHARD_SEPARATOR

KAFKA_PREFIX = "KAFKA_"
# Properties for one kind of client only (KAFKA_CONSUMER_SESSION_TIMEOUT_MS).
CLIENT_PREFIXES = ("CONSUMER_", "PRODUCER_")
# A librdkafka property whose name holds one of these is masked: sasl.password,
# ssl.key.password, ssl.key.pem, sasl.oauthbearer.client.secret, the private key's
# passphrase, and sasl.oauthbearer.config / .extensions, which may carry credentials.
_SECRET_WORDS = ("password", "secret", "key", "token", "credential", "oauthbearer.config",
                 "oauthbearer.extensions")  # fmt: skip
MAX_COUNTDOWN_LIMIT = ABSOLUTE_MAX_COUNTDOWN_SECONDS
MIN_TIMEOUT = 0.01
MIN_TOKEN_CHARS = 16
# The dispatcher waits this long past BLACKBOX_DELIVERY_TIMEOUT for a batch's reports.
REPORT_GRACE_SECONDS = 1.0
# What a lease must keep beyond the longest claim-to-ack: Redis round trips, a busy CPU.
LEASE_MARGIN_SECONDS = 1.0
# The least time another replica's message must be overdue before a sweep takes it.
MIN_SWEEP_DELAY_SECONDS = 2.0


def _positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a number > 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be a whole number >= 1")
    return value


# The longest intake or firing window: what a window holds is late by it at most, and held
# (unacknowledged) in one process meanwhile.
MAX_WINDOW_MS = 1_000
# The most ids one claim or intake script may take: bounds the time one Lua call holds
# Redis (Sidekiq's lesson: 100,000 due ids in one script blocked Redis for all).
MAX_BATCH = 10_000


def _window_ms(text: str) -> int:
    value = int(text)
    if not 0 <= value <= MAX_WINDOW_MS:
        raise ValueError(f"must be a whole number of ms, 0 to {MAX_WINDOW_MS:,}")
    return value


def _batch(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_BATCH:
        raise ValueError(f"must be at most {MAX_BATCH:,} (one Lua call holds Redis)")
    return value


def _shards(text: str) -> int | None:
    if not text:  # unset: the namespace's recorded count, or DEFAULT_SHARDS (shardcount.py)
        return None
    value = _positive_int(text)
    if value > MAX_SHARDS:
        raise ValueError(f"must be at most {MAX_SHARDS:,}")
    return value


def _namespace(text: str) -> str:
    if not text or "{" in text or "}" in text or SHARD_SEPARATOR in text:
        raise ValueError(
            f"must be a non-empty name without braces or {SHARD_SEPARATOR!r} "
            "(it becomes a hash tag, and its shards' tags add '#' and a number)"
        )
    return text


def _countdown_limit(text: str) -> float:
    value = _positive_float(text)
    if value > MAX_COUNTDOWN_LIMIT:
        raise ValueError(f"must be at most {MAX_COUNTDOWN_LIMIT:.0f} s (1,000 years)")
    return value


def _timeout(text: str) -> float:
    value = _positive_float(text)
    if value < MIN_TIMEOUT:
        raise ValueError(f"must be at least {MIN_TIMEOUT} s")
    return value


def _topic(text: str) -> str:
    if not text or text.startswith("__"):
        raise ValueError("must be a topic name not starting with '__'")
    return text


def _optional_topic(text: str) -> str:
    return "" if text == "" else _topic(text)


def _port(text: str) -> int | None:
    if text == "off":
        return None
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port 0-65535 (0: any free port) or 'off'")
    return value


_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def _flag(text: str) -> bool:
    word = text.lower()
    if word not in _TRUE + _FALSE:
        raise ValueError("must be true or false")
    return word in _TRUE


def _token(text: str) -> str:
    if text and len(text) < MIN_TOKEN_CHARS:
        raise ValueError(f"must be empty (no token) or at least {MIN_TOKEN_CHARS} characters")
    return text


# A host name, "*.domain" (any name under it), an IP address ([::1] for IPv6), or "*" (any).
_HOST_PATTERN = re.compile(r"\*|(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\]")


def _hosts(text: str) -> tuple[str, ...]:
    names = tuple(name.strip().lower() for name in text.split(",") if name.strip())
    for name in names:
        if not _HOST_PATTERN.fullmatch(name):
            raise ValueError(f"{name!r} is not a host name, *.domain, an IP address or *")
    return names


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return text

    return parse


@dataclass(frozen=True, slots=True)
class Var:
    """One environment variable: where it goes, how it is read, its default and meaning."""

    name: str
    attribute: str
    parse: Callable[[str], Any]
    default: str
    help: str
    secret: bool = False  # its value is never shown: not in repr, not in an error


VARIABLES: tuple[Var, ...] = (
    Var("REDIS_URL", "redis_url", str, "redis://localhost:6379/0",
        "Redis to keep schedules in (rediss:// for TLS; a password in it is masked in logs); "
        "redis+sentinel://host:26379,host2:26379/mymaster/0 (or rediss+sentinel://) for the "
        "master Redis Sentinel names (?sentinel_password= if the Sentinels want their own); "
        "redis+cluster://host:port (or rediss+cluster://), naming any one node, for Redis "
        "Cluster",
        secret=True),
    Var("BLACKBOX_ACCEPT_EVICTION", "accept_eviction", _flag, "false",
        "true: start on a Redis whose maxmemory-policy is not noeviction (it may delete "
        "payloads: lost schedules; see Going to production, Redis memory)"),
    Var("BLACKBOX_NAMESPACE", "namespace", _namespace, "bb",
        "Redis key hash tag (no braces, no #); one per deployment"),
    Var("BLACKBOX_SHARDS", "shards", _shards, "",
        "shards the pending messages are spread over (each its own hash tag, so its own Redis "
        "Cluster slot), so that firing replicas share the work: at least the firing replicas, "
        "a multiple of the masters; empty: the count the namespace was written with (one for "
        "data written before counts were recorded), or 16 for a new one; keep it fixed while "
        "any are pending"),
    Var("BLACKBOX_REREAD_LIMIT", "reread_limit", _positive_int, "100000",
        "the most intake records of one partition read again by themselves when Redis holds "
        "less than the group committed (a failover to a lagging replica); a larger gap is "
        "lost data, handled as BLACKBOX_REDIS_LOSS says"),
    Var("BLACKBOX_REDIS_MAX_LAG", "redis_max_lag", _positive_float, "60",
        "seconds: the most a failover's lag may span. A Redis whose clock went back further "
        "(a snapshot restored), or that lost its clock (flushed, restarted empty), lost data, "
        "handled as BLACKBOX_REDIS_LOSS says; firing claims nothing from it meanwhile"),
    Var("BLACKBOX_REDIS_LOSS", "redis_loss", _choice("stop", "reread", "skip"), "stop",
        "when Redis lost data (flushed, restarted empty or restored from an older snapshot; "
        "a gap over BLACKBOX_REREAD_LIMIT; no watermark at all under committed offsets; "
        "committed offsets Kafka deleted unread): stop reading the intake and firing (/ready "
        "503, alert BlackboxRedisLostData), reread it all (what the target topics show "
        "delivered is passed over) or skip it (its schedules given up, counted); rebuilding "
        "Redis (blackbox rebuild) ends the stop too"),
    Var("BLACKBOX_INTAKE_TOPIC", "intake_topic", _topic, "blackbox", "topic schedules arrive on"),
    Var("BLACKBOX_GROUP_ID", "group_id", str, "blackbox", "consumer group of the intake"),
    Var("BLACKBOX_DLQ_TOPIC", "dlq_topic", _topic, "blackbox.dlq", "dead-letter topic"),
    Var("BLACKBOX_EVENTS_TOPIC", "events_topic", _topic, "blackbox.events",
        "topic of the answers: scheduled, updated, cancelled, already_fired, ..."),
    Var("BLACKBOX_STORE_TOPIC", "store_topic", _optional_topic, "",
        "compacted topic keeping each pending schedule's latest version under its id (a "
        "tombstone when it ends), so a rebuild reads what is pending rather than every "
        "request, and the intake topic need keep only a day; empty: off (see The store "
        "topic)"),
    Var("BLACKBOX_STORAGE_MODE", "storage_mode", _choice("inline", "index"), "inline",
        "inline: Redis keeps each pending schedule whole; index (needs BLACKBOX_STORE_TOPIC): "
        "Redis keeps a one-off schedule's due time, caller and place in the store topic, "
        "and firing reads its record back from there (see The store topic)"),
    Var("BLACKBOX_STORE_CACHE_MB", "store_cache_mb", _positive_int, "256",
        "index mode: megabytes of store records a process keeps after writing or reading "
        "them; what falls due within 10 s is read ahead into half of it, so size it to "
        "twice the bytes of the largest burst (a burst beyond it is read back when due)"),
    Var("BLACKBOX_POLICY_FILE", "policy_file", str, "",
        "YAML or JSON per-caller policy; empty: any caller may target any topic, within the "
        "limits"),
    Var("BLACKBOX_POLL_INTERVAL", "poll_interval", _positive_float, "1.0",
        "seconds between firing ticks"),
    Var("BLACKBOX_BATCH_LIMIT", "batch_limit", _batch, "1000",
        "most ids one claim takes, at most 10,000 (one Lua call holds Redis); a full claim is "
        "followed at once by the next"),
    Var("BLACKBOX_BATCH_BYTES", "batch_bytes", _positive_int, "16777216",
        "most payload bytes one claim takes (one id at least, whatever its size); sent and "
        "unsettled payloads stay under 4 times this"),
    Var("BLACKBOX_INTAKE_BATCH", "intake_batch", _batch, "500",
        "most intake records handled per poll, at most 10,000 (sent to Redis in parts of "
        "100); a poll waits for its first record, then gathers more for "
        "BLACKBOX_INTAKE_WINDOW_MS while they keep coming"),
    Var("BLACKBOX_INTAKE_WINDOW_MS", "intake_window_ms", _window_ms, "25",
        "milliseconds intake goes on gathering records after the first of a poll, while more "
        "keep coming (it stops at a 5 ms pause): a steady stream costs a Redis write, a crash "
        "note and an answers request per window, not per record. A record whose countdown is "
        "shorter than the window may be late by it; 0: each poll is handled as it comes"),
    Var("BLACKBOX_FIRE_AHEAD_MS", "fire_ahead_ms", _window_ms, "100",
        "milliseconds of due messages one claim takes ahead: the process holds them and "
        "produces each at its due instant, so a steady stream costs a claim and an ack per "
        "shard and window, not per message. A replica killed meanwhile leaves what it held "
        "to come back after its lease (late, not lost), and what it sent in the window and "
        "had not acknowledged yet may be delivered again; 0: claim at each due instant"),
    Var("BLACKBOX_FIRE_COALESCE_MS", "fire_coalesce_ms", _window_ms, "3",
        "least milliseconds between two wakes of firing: the messages due within it leave "
        "together, each at most this late. A steady stream then pays a wake's cost (about "
        "100 µs of CPU) per few messages, not per message; one slower than a due instant "
        "per interval never waits. 0: a wake at each due instant"),
    Var("BLACKBOX_LEASE_SECONDS", "lease_seconds", _positive_float, "30",
        "how long a claimed id is held before another replica may fire it, counted from the "
        "claim; must be longer than the delivery timeout + 1 s + the sweep delay (2 poll "
        "intervals, at least 2 s) + 1 s, or the start is refused (exit code 2)"),
    Var("BLACKBOX_DELIVERY_TIMEOUT", "delivery_timeout", _timeout, "10",
        "seconds the broker has to acknowledge a delivery (see BLACKBOX_LEASE_SECONDS)"),
    Var("BLACKBOX_MAX_ATTEMPTS", "max_attempts", _positive_int, "5",
        "attempts before a lasting delivery failure is dead-lettered"),
    Var("BLACKBOX_RETRY_BACKOFF", "retry_backoff", _positive_float, "1.0",
        "first retry delay in seconds; doubles per attempt"),
    Var("BLACKBOX_RETRY_BACKOFF_MAX", "retry_backoff_max", _positive_float, "60",
        "longest retry delay in seconds"),
    Var("BLACKBOX_GRACE_SECONDS", "grace_seconds", _positive_int, "604800",
        "how long past its due time a payload is kept (a service down for less still fires "
        "it late, not never)"),
    Var("BLACKBOX_MAX_MESSAGE_BYTES", "max_message_bytes", _positive_int, "1048576",
        "largest intake record value accepted"),
    Var("BLACKBOX_MAX_COUNTDOWN", "max_countdown", _countdown_limit, "315576000",
        "the horizon: how far ahead a due time may be, seconds (default 10 years); the "
        "policy may set it per caller"),
    Var("BLACKBOX_FIRED_RETENTION", "fired_retention", _positive_int, "86400",
        "seconds a caller's id is remembered after it fired or was cancelled (answers to "
        "late cancels; one key each)"),
    Var("BLACKBOX_HTTP_HOST", "http_host", str, "0.0.0.0",  # noqa: S104 - probes come from outside
        "address of the HTTP server: the admin page (/), the API (/api/v1) and the probes "
        "(/live, /ready, /metrics); `blackbox dev`: 127.0.0.1"),
    Var("BLACKBOX_HTTP_PORT", "http_port", _port, "8080",
        "its port; 0 picks a free one, 'off' serves none"),
    Var("BLACKBOX_PROBE_PORT", "probe_port", _port, "off",
        "port of a listener of its own serving only /live, /ready and /metrics, with caps of "
        "its own, so API clients can never starve the probes (the Helm chart sets 8081 and "
        "points its probes there); 0 picks a free one; off: none (the probes are also on "
        "BLACKBOX_HTTP_PORT, with 16 connections beyond its cap kept for them)"),
    Var("BLACKBOX_HTTP_HEADER_TIMEOUT", "http_header_timeout", _positive_float, "10",
        "seconds a connection has to send a whole request head (from connecting, or from "
        "its last answer); then it is closed (a half-sent head answered 408)"),
    Var("BLACKBOX_HTTP_BODY_TIMEOUT", "http_body_timeout", _positive_float, "30",
        "seconds a request has to send its whole body once its head is in; then it is "
        "answered 408 and closed"),
    Var("BLACKBOX_HTTP_MAX_CONNECTIONS", "http_max_connections", _positive_int, "1000",
        "most open HTTP connections (at most half the free file descriptors at start); one "
        "more closes the one waiting longest for a request, or is answered 503 when all are "
        "busy; 16 more are kept for /live, /ready and /metrics"),
    Var("BLACKBOX_HTTP_ANSWER_TIMEOUT", "http_answer_timeout", _positive_float, "30",
        "seconds an answer's bytes may wait to leave for a client that reads them slowly "
        "(from the write that found none waiting); then the connection is aborted"),
    Var("BLACKBOX_HTTP_MAX_CONNECTIONS_PER_CLIENT", "http_max_connections_per_client",
        _positive_int, "100",
        "most open HTTP connections from one client address (raise it behind a proxy that "
        "gathers many clients); one more closes that address's one waiting longest for a "
        "request, or is answered 503 when all are busy"),
    Var("BLACKBOX_API_TOKEN", "api_token", _token, "",
        "the operator's bearer token of the HTTP API (every caller), 16+ characters; empty: "
        "none, mutations refused",
        secret=True),
    Var("BLACKBOX_API_TOKENS_FILE", "api_tokens_file", str, "",
        "YAML or JSON of tokens acting for some callers (SHA-256 hashes, callers, read and/or "
        "write scopes)"),
    Var("BLACKBOX_API_SIGNING_KEY_FILE", "api_signing_key_file", str, "",
        "Ed25519 private key (PEM) the API signs its requests for callers with (needed for "
        "callers that must sign)"),
    Var("BLACKBOX_API_KEY_ID", "api_key_id", str, "blackbox-api",
        "the key id the callers' policy lists the API's public key under"),
    Var("BLACKBOX_API_READS", "api_reads", _choice("open", "token"), "token",
        "open: anyone reaching the port may read schedules; token: reads need the token too"),
    Var("BLACKBOX_API_DEV_OPEN", "api_dev_open", _flag, "false",
        "local development only: without a token, allow every API call (`blackbox dev` "
        "sets it)"),
    Var("BLACKBOX_API_ALLOWED_HOSTS", "api_allowed_hosts", _hosts, "",
        "with the API open (reads open, or dev open without a token): Host names answered "
        "besides localhost, 127.0.0.1 and [::1], comma-separated (*.domain, * for any)"),
    Var("BLACKBOX_HEALTH_INTERVAL", "health_interval", _positive_float, "2",
        "seconds between probes of Redis (its memory, whether it has room for intake) and "
        "the broker (a metadata request), which readiness reports"),
    Var("BLACKBOX_LOG_FORMAT", "log_format", _choice("auto", "json", "console"), "auto",
        "auto: console on a terminal, JSON otherwise"),
    Var("BLACKBOX_LOG_LEVEL", "log_level", _choice("debug", "info", "warning", "error"), "info",
        "least severe log level written"),
)  # fmt: skip

# The librdkafka properties given a default here (the rest are librdkafka's own): each is a
# row of `blackbox run --help` and of the settings reference; `attribute` is the property.
KAFKA_DEFAULTS: tuple[Var, ...] = (
    Var("KAFKA_BOOTSTRAP_SERVERS", "bootstrap.servers", str, "localhost:9092",
        "the Kafka brokers to start from, host:port comma-separated"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the service is tuned by. Build it with `Settings.from_env`."""

    redis_url: str
    accept_eviction: bool
    namespace: str
    shards: int | None  # None: unset (see layout.adopt)
    reread_limit: int
    redis_max_lag: float
    redis_loss: str
    intake_topic: str
    group_id: str
    dlq_topic: str
    events_topic: str
    store_topic: str
    storage_mode: str
    store_cache_mb: int
    policy_file: str
    poll_interval: float
    batch_limit: int
    batch_bytes: int
    intake_batch: int
    intake_window_ms: int
    fire_ahead_ms: int
    fire_coalesce_ms: int
    lease_seconds: float
    delivery_timeout: float
    max_attempts: int
    retry_backoff: float
    retry_backoff_max: float
    grace_seconds: int
    max_message_bytes: int
    max_countdown: float
    fired_retention: int
    http_host: str
    http_port: int | None
    probe_port: int | None
    http_header_timeout: float
    http_body_timeout: float
    http_max_connections: int
    http_answer_timeout: float
    http_max_connections_per_client: int
    api_token: str
    api_tokens_file: str
    api_signing_key_file: str
    api_key_id: str
    api_reads: str
    api_dev_open: bool
    api_allowed_hosts: tuple[str, ...]
    health_interval: float
    log_format: str
    log_level: str
    kafka: Mapping[str, str] = field(default_factory=dict)
    kafka_consumer: Mapping[str, str] = field(default_factory=dict)
    kafka_producer: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Read and validate every setting; raise SettingsError naming the bad variable.

        The variables Kubernetes injects for the namespace's Services (`service_links`)
        are left out first: they are addresses of neighbours, never settings.
        """
        links = service_links(environ)
        environ = {k: v for k, v in environ.items() if k not in links}
        values = {var.attribute: _read(var, environ) for var in VARIABLES}
        settings = cls(
            **values,
            kafka=kafka_config(environ),
            kafka_consumer=kafka_config(environ, "CONSUMER_"),
            kafka_producer=kafka_config(environ, "PRODUCER_"),
        )
        settings.check()
        return settings

    @property
    def own_topics(self) -> list[str]:
        """The topics blackbox itself reads and writes: intake, dead letters, events, and
        the store topic where one is set."""
        store = [self.store_topic] if self.store_topic else []
        return [self.intake_topic, self.dlq_topic, self.events_topic, *store]

    @property
    def sweep_delay(self) -> float:
        """Seconds another replica's message must be overdue before a sweep takes it."""
        return sweep_delay(self.poll_interval)

    @property
    def least_lease_seconds(self) -> float:
        """The lease must be longer than this: a claim's delivery may take the delivery
        timeout and the wait for its reports, and a claim in a sweep comes at the end of a
        tick that may have waited the sweep delay behind a burst or a starved CPU."""
        return (
            self.delivery_timeout + REPORT_GRACE_SECONDS + self.sweep_delay
            + LEASE_MARGIN_SECONDS
        )  # fmt: skip

    def check(self) -> None:
        """Cross-field rules no single variable can enforce."""
        least = self.least_lease_seconds
        if self.lease_seconds <= least:
            raise SettingsError(
                f"BLACKBOX_LEASE_SECONDS={self.lease_seconds:g} must be longer than "
                f"BLACKBOX_DELIVERY_TIMEOUT ({self.delivery_timeout:g}) + "
                f"{REPORT_GRACE_SECONDS:g} s (the wait for its reports) + the sweep delay "
                f"({self.sweep_delay:g} s: 2 x BLACKBOX_POLL_INTERVAL, at least "
                f"{MIN_SWEEP_DELAY_SECONDS:g} s) + {LEASE_MARGIN_SECONDS:g} s = {least:g} s, "
                "or a slow delivery loses its lease and fires twice"
            )
        if len(set(self.own_topics)) < len(self.own_topics):
            raise SettingsError(
                "BLACKBOX_INTAKE_TOPIC, BLACKBOX_DLQ_TOPIC, BLACKBOX_EVENTS_TOPIC and "
                "BLACKBOX_STORE_TOPIC (where set) must differ"
            )
        if self.storage_mode == "index" and not self.store_topic:
            raise SettingsError(
                "BLACKBOX_STORAGE_MODE=index needs BLACKBOX_STORE_TOPIC: firing reads each "
                "schedule back from the store topic"
            )

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        for var in VARIABLES:
            if var.secret:
                shown[var.attribute] = _masked(var, getattr(self, var.attribute))
        for name in ("kafka", "kafka_consumer", "kafka_producer"):
            shown[name] = {k: MASK if _is_secret(k) else v for k, v in shown[name].items()}
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def sweep_delay(poll_interval: float) -> float:
    """How overdue another replica's message must be before a sweep fires it: two poll
    intervals, at least MIN_SWEEP_DELAY_SECONDS (its owner fires it on time while alive)."""
    return max(MIN_SWEEP_DELAY_SECONDS, 2 * poll_interval)


def _read(var: Var, environ: Mapping[str, str]) -> Any:
    text = environ.get(var.name, var.default).strip()
    try:
        return var.parse(text)
    except ValueError as e:
        shown = _masked(var, text) if var.secret else text
        raise SettingsError(f"{var.name}={shown!r} is invalid: {e}") from e


def _masked(var: Var, value: str) -> str:
    """A secret variable's value as it may be shown: a URL with its password masked, any
    other secret as asterisks (empty stays empty: "no token" is no secret)."""
    if var.name == "REDIS_URL":
        return mask_url(value)
    return MASK if value else ""


# What Kubernetes (and Docker's legacy links) inject for a Service named NAME:
# NAME_SERVICE_HOST, NAME_SERVICE_PORT[_PORTNAME], NAME_PORT=tcp://ip:port and
# NAME_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]; a Docker link adds NAME_NAME=/a/b and a
# NAME_ENV_<VAR> per variable of the linked container. A Service called `kafka` would
# otherwise reach librdkafka as properties such as `port.9092.tcp.addr`.
_SERVICE_HOST = "_SERVICE_HOST"
_LINK_URL = re.compile(r"(tcp|udp|sctp)://", re.IGNORECASE)
_LINK_PORT = re.compile(r"_PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?")


def service_links(environ: Mapping[str, str]) -> frozenset[str]:
    """The variables in `environ` that a Service link injected, to be ignored.

    Only names of the link shapes count, and only for a Service that is there (its
    NAME_SERVICE_HOST, or a NAME_PORT holding a URL): an operator's own KAFKA_* or
    BLACKBOX_*_PORT=8080 is kept.
    """
    services = {k[: -len(_SERVICE_HOST)] for k in environ if k.endswith(_SERVICE_HOST)}
    services |= {k[: -len("_PORT")] for k, v in environ.items()
                 if k.endswith("_PORT") and _LINK_URL.match(v)}  # fmt: skip
    return frozenset(k for k in environ if any(_is_link(k, name, environ) for name in services))


def _is_link(variable: str, service: str, environ: Mapping[str, str]) -> bool:
    if not variable.startswith(service + "_"):
        return False
    rest = variable[len(service) :]
    if rest in (_SERVICE_HOST, "_SERVICE_PORT") or rest.startswith("_SERVICE_PORT_"):
        return True
    if rest.startswith("_ENV_") or (rest == "_NAME" and environ[variable].startswith("/")):
        return f"{service}_PORT" in environ
    link = _LINK_PORT.fullmatch(rest)
    if link and link.group(2):  # NAME_PORT_9092_TCP_ADDR and its kin
        return True
    return (rest == "_PORT" or link is not None) and bool(_LINK_URL.match(environ[variable]))


def kafka_config(environ: Mapping[str, str], client: str = "") -> dict[str, str]:
    """librdkafka properties from KAFKA_[client]* variables.

    With no `client`, the properties every client shares (those of KAFKA_DEFAULTS given
    their defaults); with "CONSUMER_" or "PRODUCER_", those of that client alone.
    """
    config = {} if client else {var.attribute: var.default for var in KAFKA_DEFAULTS}
    prefix = KAFKA_PREFIX + client
    for name, value in environ.items():
        rest = name[len(prefix) :]
        if not name.startswith(prefix) or not rest:
            continue
        if not client and rest.startswith(CLIENT_PREFIXES):
            continue
        config[rest.lower().replace("_", ".")] = value
    return config


def kafka_variable(property_name: str) -> str:
    """The environment variable that sets a librdkafka property."""
    return KAFKA_PREFIX + property_name.upper().replace(".", "_")


def _is_secret(property_name: str) -> bool:
    return any(word in property_name for word in _SECRET_WORDS)


def describe() -> str:
    """A table of every variable, its default and meaning, for `blackbox run --help`."""
    width = max(len(v.name) for v in VARIABLES)
    rows = [f"  {v.name:<{width}}  {v.help} (default: {v.default})"
            for v in (*VARIABLES, *KAFKA_DEFAULTS)]  # fmt: skip
    rows.append(
        f"  {'KAFKA_*':<{width}}  any librdkafka property: KAFKA_SECURITY_PROTOCOL, "
        "KAFKA_SASL_USERNAME, ... (dots become underscores)"
    )
    rows.append(
        f"  {'KAFKA_CONSUMER_*':<{width}}  a property for the intake consumer only "
        "(KAFKA_CONSUMER_SESSION_TIMEOUT_MS)"
    )
    rows.append(
        f"  {'KAFKA_PRODUCER_*':<{width}}  a property for the producers only "
        "(KAFKA_PRODUCER_LINGER_MS)"
    )
    return "\n".join(rows)

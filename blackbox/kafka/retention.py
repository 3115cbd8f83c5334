"""Retention: how long the intake topics must keep their records, and whether they do.

Kafka holds every request blackbox accepted; Redis holds what is pending. What Redis loses
(a failover's lag, a flush, an old snapshot restored) is read again or rebuilt from the
intake topics, so they must keep a request at least as long as it can be pending: the
longest horizon any caller may schedule at, plus the grace firing has past a due time.
`blackbox create-topics` sets that retention, and the service warns at start where a topic
keeps less; the dead-letter topic alike (a rebuild reads there what was refused and what
failed for good).

Two other topic settings delete requests whatever retention.ms says: `retention.bytes` (a
partition's oldest segments go once it holds more) and `cleanup.policy` with `compact`
(only the newest record of each key is kept: a schedule's earlier versions and its
creation record go). Both may be an operator's deliberate choice (a disk budget, a topic
shared on purpose), so neither is changed here: the service and `blackbox create-topics`
name them in a warning.

The store topic (kafka/storetopic.py) is the other way round: it holds the only version
of a schedule pending longer than the intake topics keep requests, so it must be compacted
and only compacted (`cleanup.policy=compact`; with `delete` in it, retention.ms deletes a
long-pending schedule's version). `blackbox create-topics` creates it so, and it and the
service refuse one found otherwise (`check_store`): changing it is the operator's act.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from blackbox.errors import StoreTopicRefused

if TYPE_CHECKING:
    from blackbox.settings import Settings

log = structlog.get_logger("blackbox.kafka.retention")

RETENTION = "retention.ms"
SIZE = "retention.bytes"
CLEANUP = "cleanup.policy"
COMPACT = "compact"  # the store topic's cleanup.policy, alone
FOREVER = -1  # Kafka's retention.ms for "never delete"
UNLIMITED = -1  # Kafka's retention.bytes for "no size cap"


@dataclass(frozen=True, slots=True)
class Kept:
    """How a topic keeps its records, as the broker tells it (None: it does not tell)."""

    retention_ms: int | None = None
    retention_bytes: int | None = None
    cleanup_policy: str | None = None


def needed_ms(longest_horizon_seconds: float, grace_seconds: int) -> int:
    """The retention the intake topics need: the longest horizon any caller may schedule
    at, plus the grace firing has past a due time."""
    return int((longest_horizon_seconds + grace_seconds) * 1000)


# What the intake topics must keep beside a store topic: the window a failover's re-read,
# or a rebuild's reading past the committed offsets, can need (the store holds the rest).
STORE_WINDOW_SECONDS = 86_400


class Horizons(Protocol):
    """What the callers' policy tells of how far ahead they may schedule."""

    @property
    def longest_horizon_seconds(self) -> float: ...


def intake_needed_ms(settings: Settings, policy: Horizons) -> int:
    """The retention `settings`' intake topics need: a day beside a store topic, else
    the longest horizon plus the grace (`needed_ms`)."""
    if settings.store_topic:
        return STORE_WINDOW_SECONDS * 1000
    return needed_ms(policy.longest_horizon_seconds, settings.grace_seconds)


def kept(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float = 10.0
) -> dict[str, Kept]:
    """How each existing topic keeps its records (KafkaException if the broker cannot be
    asked); a setting the broker does not tell (Tansu) is None."""
    admin = AdminClient(dict(config))
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    futures = admin.describe_configs(resources, request_timeout=timeout)
    found = {}
    for resource, future in futures.items():
        entries = future.result(timeout)
        ms, size, cleanup = (_value(entries, name) for name in (RETENTION, SIZE, CLEANUP))
        found[resource.name] = Kept(
            None if ms is None else int(ms), None if size is None else int(size), cleanup
        )
    return found


def _value(entries: Mapping[str, ConfigEntry], name: str) -> str | None:
    entry = entries.get(name)
    return None if entry is None else entry.value


def current_ms(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float = 10.0
) -> dict[str, int]:
    """Each existing topic's retention.ms where the broker tells it (KafkaException if it
    cannot be asked)."""
    return {
        topic: found.retention_ms
        for topic, found in kept(config, topics, timeout).items()
        if found.retention_ms is not None
    }


def short(retention: int, needed: int) -> bool:
    """Whether a topic keeping records `retention` ms keeps them less than `needed` ms."""
    return retention != FOREVER and retention < needed


def size_capped(found: Kept) -> bool:
    """Whether the topic deletes its oldest records past a size (retention.bytes)."""
    return found.retention_bytes is not None and found.retention_bytes != UNLIMITED


def compacted(found: Kept) -> bool:
    """Whether the topic keeps only the newest record of each key (cleanup.policy)."""
    return COMPACT in _policies(found)


def _policies(found: Kept) -> list[str]:
    return [part.strip() for part in (found.cleanup_policy or "").split(",") if part.strip()]


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One way a topic deletes requests before their schedules fire: the event it is logged
    as, the setting found, why it matters and what to do."""

    event: str
    found: Mapping[str, Any]
    why: str
    action: str


DELETED = "what Redis loses is read again or rebuilt from the intake topic; records deleted "


def shortfalls(found: Kept, needed: int, store_topic: str = "") -> list[Shortfall]:
    """How a topic keeping records as `found` deletes requests that may still be pending,
    where each must be kept `needed` ms (beside the store topic `store_topic`, if set)."""
    result = []
    if found.retention_ms is not None and short(found.retention_ms, needed):
        result.append(_short(found.retention_ms, needed, store_topic))
    if size_capped(found):
        result.append(Shortfall(
            "intake_retention_size_capped", {"retention_bytes": found.retention_bytes},
            DELETED + "once a partition holds more than retention.bytes cannot be, however "
            "long retention.ms is",
            f"set retention.bytes=-1 on the topic, or size it for {needed} ms of requests",
        ))  # fmt: skip
    if compacted(found):
        result.append(Shortfall(
            "intake_topic_compacted", {"cleanup_policy": found.cleanup_policy},
            DELETED + "by compaction (a schedule's earlier versions, its creation record, "
            "every record but the newest of its key) cannot be",
            "set cleanup.policy=delete on the topic",
        ))  # fmt: skip
    return result


def _short(retention_ms: int, needed: int, store_topic: str) -> Shortfall:
    action = "blackbox create-topics raises it (or set retention.ms yourself)"
    found = {"retention_ms": retention_ms, "needed_ms": needed}
    if not store_topic:
        return Shortfall("intake_retention_short", found,
                         DELETED + "before their schedules fire cannot be", action)  # fmt: skip
    why = (f"beside the store topic {store_topic!r} (which holds what is pending) the intake "
           f"topics must keep the one-day window ({STORE_WINDOW_SECONDS} s) a re-read or a "
           "rebuild reads past the committed offsets; records deleted sooner cannot be read "
           "again")  # fmt: skip
    return Shortfall("intake_retention_short", {**found, "store_topic": store_topic}, why, action)


def store_refusal(topic: str, found: Kept | None, bootstrap: str) -> str | None:
    """Why the store topic `topic`, kept as `found` (None: it does not exist), cannot hold
    the pending schedules; None where it can (`cleanup.policy=compact` alone), or where the
    broker does not tell its cleanup.policy. `bootstrap` goes into the command to fix it."""
    if found is None:
        return (f"BLACKBOX_STORE_TOPIC={topic}: the topic does not exist. Run `blackbox "
                "create-topics`, which creates it with cleanup.policy=compact (a topic the "
                "broker creates at a first write would have cleanup.policy=delete)")  # fmt: skip
    if found.cleanup_policy is None or _policies(found) == [COMPACT]:
        return None
    kept_for = "" if found.retention_ms is None else f" (retention.ms={found.retention_ms})"
    return (f"BLACKBOX_STORE_TOPIC={topic}: the topic has cleanup.policy="
            f"{found.cleanup_policy}, not compact alone: a schedule pending longer than its "
            f"retention{kept_for} would lose the only version the store holds of it. "
            "blackbox create-topics leaves an existing topic's policy as it is; fix it with: "
            f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
            f"--entity-name {topic} --add-config cleanup.policy={COMPACT}")  # fmt: skip


def check_store(config: Mapping[str, Any], topic: str, timeout: float = 10.0) -> None:
    """Raise StoreTopicRefused where the store topic `topic` does not exist or is not
    compacted alone (`store_refusal`), in one describe call; KafkaException if the broker
    cannot be asked."""
    try:
        found: Kept | None = kept(config, [topic], timeout).get(topic)
    except KafkaException as e:
        if not _unknown_topic(e):
            raise
        found = None
    except TimeoutError as e:  # the wait ran out before the request's own timeout fired
        no_answer = KafkaError(KafkaError._TIMED_OUT, f"no answer in {timeout:g} s")
        raise KafkaException(no_answer) from e
    bootstrap = str(config.get("bootstrap.servers", "BROKER"))
    refusal = store_refusal(topic, found, bootstrap)
    if refusal is not None:
        raise StoreTopicRefused(refusal)
    if found is not None and found.cleanup_policy is None:
        log.info("store_topic_policy_unknown", topic=topic)  # a broker that does not tell


def _unknown_topic(error: KafkaException) -> bool:
    cause = error.args[0] if error.args else None
    return isinstance(cause, KafkaError) and cause.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def raise_to(
    config: Mapping[str, Any], topics: Iterable[str], needed: int, timeout: float = 10.0
) -> dict[str, int]:
    """Raise the retention of the topics that keep records less than `needed` ms (never
    lower one); the retention each raised topic had before. It returns once the broker
    tells the new retention (KRaft applies a change a moment after accepting it, and a
    service started at once would find the old one). A size cap or compaction is left as
    found, and logged as a warning."""
    found = kept(config, topics, timeout)
    for topic, limits in sorted(found.items()):
        for shortfall in shortfalls(limits, needed):
            if shortfall.event != "intake_retention_short":  # raised below
                _warn(topic, shortfall)
    before = {
        t: limits.retention_ms
        for t, limits in found.items()
        if limits.retention_ms is not None and short(limits.retention_ms, needed)
    }
    if not before:
        return {}
    admin = AdminClient(dict(config))
    entry = ConfigEntry(RETENTION, str(needed), incremental_operation=AlterConfigOpType.SET)
    resources = [
        ConfigResource(ConfigResource.Type.TOPIC, t, incremental_configs=[entry]) for t in before
    ]
    for future in admin.incremental_alter_configs(resources, request_timeout=timeout).values():
        future.result(timeout)
    _until_told(config, list(before), needed, timeout)
    return before


# How often a change not yet told is asked about again.
TOLD_POLL_SECONDS = 0.05


def _until_told(config: Mapping[str, Any], topics: list[str], needed: int, timeout: float) -> None:
    """Wait until the broker tells every topic's retention as at least `needed` ms;
    KafkaException if it still does not after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        told = current_ms(config, topics, timeout)
        if not any(short(told.get(topic, 0), needed) for topic in topics):
            return
        time.sleep(TOLD_POLL_SECONDS)
    raise KafkaException(f"the broker accepted retention.ms={needed} for {topics} but does not "
                         f"tell it after {timeout:g} s")  # fmt: skip


def warn_if_short(
    config: Mapping[str, Any], topics: Iterable[str], needed: int, store_topic: str = ""
) -> list[str]:
    """Log each way an intake topic deletes requests before they can fire (a retention.ms
    under `needed` ms, a size cap, compaction); the topics named. Beside a store topic
    (`store_topic`) the retention warning names the window the intake topics keep. A broker
    that cannot tell is logged and passed over."""
    try:
        found = kept(config, topics)
    except Exception as e:  # noqa: BLE001 - a warning at start must never stop intake
        log.info("intake_retention_unknown", error=str(e))
        return []
    named = []
    for topic, limits in sorted(found.items()):
        found_short = shortfalls(limits, needed, store_topic)
        for shortfall in found_short:
            _warn(topic, shortfall)
        if found_short:
            named.append(topic)
    return named


def _warn(topic: str, shortfall: Shortfall) -> None:
    log.warning(shortfall.event, topic=topic, **shortfall.found, why=shortfall.why,
                action=shortfall.action)  # fmt: skip

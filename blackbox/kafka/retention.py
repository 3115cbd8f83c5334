"""Retention: how long the intake topics must keep their records, and whether they do.

Kafka holds every request blackbox accepted; Redis holds what is pending. What Redis loses
(a failover's lag, a flush, an old snapshot restored) is read again or rebuilt from the
intake topics, so they must keep a request at least as long as it can be pending: the
longest horizon any caller may schedule at, plus the grace firing has past a due time.
`blackbox create-topics` sets that retention, and the service warns at start where a topic
keeps less.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

log = structlog.get_logger("blackbox.kafka.retention")

RETENTION = "retention.ms"
FOREVER = -1  # Kafka's retention.ms for "never delete"


def needed_ms(longest_horizon_seconds: float, grace_seconds: int) -> int:
    """The retention the intake topics need: the longest horizon any caller may schedule
    at, plus the grace firing has past a due time."""
    return int((longest_horizon_seconds + grace_seconds) * 1000)


def current_ms(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float = 10.0
) -> dict[str, int]:
    """Each existing topic's retention.ms where the broker tells it (KafkaException if it
    cannot be asked)."""
    admin = AdminClient(dict(config))
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    futures = admin.describe_configs(resources, request_timeout=timeout)
    found = {}
    for resource, future in futures.items():
        entry = future.result(timeout).get(RETENTION)
        if entry is not None and entry.value is not None:  # a broker may not tell (Tansu)
            found[resource.name] = int(entry.value)
    return found


def short(retention: int, needed: int) -> bool:
    """Whether a topic keeping records `retention` ms keeps them less than `needed` ms."""
    return retention != FOREVER and retention < needed


def raise_to(
    config: Mapping[str, Any], topics: Iterable[str], needed: int, timeout: float = 10.0
) -> dict[str, int]:
    """Raise the retention of the topics that keep records less than `needed` ms (never
    lower one); the retention each raised topic had before."""
    before = {t: ms for t, ms in current_ms(config, topics, timeout).items() if short(ms, needed)}
    if not before:
        return {}
    admin = AdminClient(dict(config))
    entry = ConfigEntry(RETENTION, str(needed), incremental_operation=AlterConfigOpType.SET)
    resources = [
        ConfigResource(ConfigResource.Type.TOPIC, t, incremental_configs=[entry]) for t in before
    ]
    for future in admin.incremental_alter_configs(resources, request_timeout=timeout).values():
        future.result(timeout)
    return before


def warn_if_short(config: Mapping[str, Any], topics: Iterable[str], needed: int) -> list[str]:
    """Log `intake_retention_short` for each intake topic keeping records less than `needed`
    ms; the topics named. A broker that cannot tell is logged and passed over."""
    try:
        found = current_ms(config, topics)
    except Exception as e:  # noqa: BLE001 - a warning at start must never stop intake
        log.info("intake_retention_unknown", error=str(e))
        return []
    shorts = sorted(t for t, ms in found.items() if short(ms, needed))
    for topic in shorts:
        log.warning(
            "intake_retention_short", topic=topic, retention_ms=found[topic], needed_ms=needed,
            why="what Redis loses is read again or rebuilt from the intake topic; records "
            "deleted before their schedules fire cannot be",
            action="blackbox create-topics raises it (or set retention.ms yourself)",
        )  # fmt: skip
    return shorts

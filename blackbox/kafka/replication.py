"""Replication: how many copies of each of blackbox's topics the cluster keeps, and how many
must have a record before it counts as written.

Every guarantee rests on a record the broker acknowledged staying there: a request whose
offset intake committed, a delivery whose id firing removed from Redis, a dead letter. The
producers ask for `acks=all`, which waits for the in-sync replicas only: with
`min.insync.replicas=1`, a leader that dies right after acknowledging alone loses the
record. So on a cluster of three or more brokers, each topic blackbox reads or writes keeps
3 copies with `min.insync.replicas=2` (one broker may be down and the topic is still
written; a record acknowledged is on two brokers). On fewer brokers, as many copies as
there are brokers and 1 in sync (the local stack: one broker, nothing to warn of).

`blackbox create-topics` creates the topics so; the service warns at start where a topic
keeps fewer copies or needs fewer in sync than the cluster allows. Neither changes an
existing topic: its replicas move only by a reassignment, an operator's act.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

log = structlog.get_logger("blackbox.kafka.replication")

MIN_INSYNC = "min.insync.replicas"
COPIES = 3  # the replication factor planned where the cluster has this many brokers
IN_SYNC = 2  # min.insync.replicas planned with COPIES


@dataclass(frozen=True, slots=True)
class Plan:
    """How a topic should be replicated on a cluster of some number of brokers."""

    replication_factor: int
    min_insync_replicas: int

    @classmethod
    def for_brokers(cls, brokers: int) -> Plan:
        """3 copies and 2 in sync on 3 brokers or more; else one per broker and 1 in sync."""
        copies = max(1, min(COPIES, brokers))
        return cls(copies, IN_SYNC if copies >= COPIES else 1)

    @property
    def topic_config(self) -> dict[str, str]:
        """The topic setting a new topic is created with (beside its replication factor):
        always written, since a broker's own default may ask for more copies in sync than
        the topic has."""
        return {MIN_INSYNC: str(self.min_insync_replicas)}


@dataclass(frozen=True, slots=True)
class Found:
    """How a topic is replicated, as the broker tells it (None: it does not tell)."""

    replication_factor: int
    min_insync_replicas: int | None


def brokers(config: Mapping[str, Any], timeout: float = 10.0) -> int:
    """How many brokers the cluster `config` reaches has (KafkaException if it cannot be
    asked)."""
    return len(AdminClient(dict(config)).list_topics(timeout=timeout).brokers)


def plan(config: Mapping[str, Any], timeout: float = 10.0) -> Plan:
    """The plan for the cluster `config` reaches (KafkaException if it cannot be asked)."""
    return Plan.for_brokers(brokers(config, timeout))


def found(
    config: Mapping[str, Any], topics: Iterable[str], timeout: float = 10.0
) -> dict[str, Found]:
    """How each existing topic is replicated: its fewest replicas over its partitions, and
    its min.insync.replicas (KafkaException if the broker cannot be asked)."""
    admin = AdminClient(dict(config))
    described = admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout)
    copies = {}
    for name, future in described.items():
        try:
            copies[name] = min(len(p.replicas) for p in future.result(timeout).partitions)
        except KafkaException as e:  # a topic not created yet: the others are still judged
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in copies]
    insync = {}
    for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
        entry = future.result(timeout).get(MIN_INSYNC)
        insync[resource.name] = None if entry is None or entry.value is None else int(entry.value)
    return {name: Found(count, insync.get(name)) for name, count in copies.items()}


def shortfalls(topic: Found, planned: Plan) -> dict[str, int]:
    """What of the plan a topic falls short of: its replication factor, its
    min.insync.replicas (where the broker tells it), each with what was found."""
    short = {}
    if topic.replication_factor < planned.replication_factor:
        short["replication_factor"] = topic.replication_factor
    if topic.min_insync_replicas is not None and (
        topic.min_insync_replicas < planned.min_insync_replicas
    ):
        short["min_insync_replicas"] = topic.min_insync_replicas
    return short


def warn_if_weak(
    config: Mapping[str, Any], topics: Iterable[str], planned: Plan | None = None
) -> list[str]:
    """Log each existing topic replicated less than `planned` (default: as the cluster
    allows) as `topic_replication_low`; the topics named. A broker that cannot tell is
    logged and passed over."""
    try:
        planned = planned or plan(config)
        each = found(config, topics)
    except Exception as e:  # noqa: BLE001 - a warning at start must never stop the service
        log.info("topic_replication_unknown", error=str(e))
        return []
    named = []
    for topic, replicated in sorted(each.items()):
        short = shortfalls(replicated, planned)
        if short:
            named.append(topic)
            log.warning("topic_replication_low", topic=topic, **short,
                        planned_replication_factor=planned.replication_factor,
                        planned_min_insync_replicas=planned.min_insync_replicas,
                        why="a record acknowledged by too few brokers is lost with them",
                        action="reassign the topic's partitions to more brokers, or set "
                        "min.insync.replicas (docs/production.md)")  # fmt: skip
    return named

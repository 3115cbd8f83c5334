"""Receiving: the intake consumer with its answering outbox, wired to the store.

It consumes the intake topic into Redis, answers each request on the events topic and
dead-letters what it cannot take. The earliest due time it stored in each shard is
announced (so that firing wakes then) and a write refused for memory is reported to the
memory probe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from confluent_kafka import Producer

from blackbox.envelope import Limits
from blackbox.errors import SettingsError
from blackbox.firing.nudges import Nudge
from blackbox.intake import policy
from blackbox.intake.config import IntakeConfig
from blackbox.intake.crashguard import CrashGuard
from blackbox.intake.gaps import GapConfig, Loss, Partition
from blackbox.intake.incarnations import Incarnations, RedisRecord
from blackbox.intake.keeping import Keeping
from blackbox.intake.loop import POLL_SECONDS, Intake
from blackbox.intake.nonces import Nonces
from blackbox.intake.policy import CallerPolicy
from blackbox.intake.restating import Restating
from blackbox.kafka import clients, replication, retention
from blackbox.kafka.outbox import Outbox
from blackbox.kafka.storetopic import StoreTopic
from blackbox.metrics import Metrics
from blackbox.role import Loop
from blackbox.settings import Settings
from blackbox.storage.memory import Room
from blackbox.storage.store import RedisStore


def limits_of(settings: Settings, caller_policy: CallerPolicy | None = None) -> Limits:
    """The service-wide limits: its own topics and the callers' bound intake topics are
    never targets."""
    bound = caller_policy.bound_topics if caller_policy is not None else {}
    return Limits(
        max_value_bytes=settings.max_message_bytes,
        forbidden_topics=frozenset([*settings.own_topics, *bound]),
    )


def caller_policy_of(settings: Settings) -> CallerPolicy:
    """The policy file's rules, or the open policy; SettingsError if the file is bad."""
    base = policy.open_policy(settings.max_countdown, settings.max_message_bytes)
    loaded = policy.load(settings.policy_file, base) if settings.policy_file else base
    own = set(settings.own_topics) & set(loaded.bound_topics)
    if own:
        raise SettingsError(
            f"BLACKBOX_POLICY_FILE binds blackbox's own topics {sorted(own)} to callers: "
            "intake_topics must be other topics (the shared intake, events and dead-letter "
            "topics are the service's)"
        )
    return loaded


def intake_config_of(settings: Settings, caller_policy: CallerPolicy) -> IntakeConfig:
    return IntakeConfig(
        topics=(settings.intake_topic, *sorted(caller_policy.bound_topics)),
        batch=settings.intake_batch,
        window_s=settings.intake_window_ms / 1000,
        dlq_topic=settings.dlq_topic,
        events_topic=settings.events_topic,
        limits=limits_of(settings, caller_policy),
        policy=caller_policy,
        gaps=GapConfig(
            reread_limit=settings.reread_limit,
            loss=Loss(settings.redis_loss),
            max_lag_ms=int(settings.redis_max_lag * 1000),
        ),
    )


def answers_outbox(settings: Settings) -> Outbox:
    """The producer of answers and dead letters: one answer per request, so it reports
    failures only."""

    def renew() -> Producer:
        return clients.new_producer(settings, report_only_errors=True)

    return Outbox(renew(), settings.delivery_timeout + 1.0, renew, only_errors=True)


class Receiving:
    """Consumes the intake topic into the store on one thread (`loops()`)."""

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self, settings: Settings, store: RedisStore, metrics: Metrics, *,
        caller_policy: CallerPolicy, room: Room, stopping: threading.Event,
        announce: Nudge, redis_checked: threading.Event,
        on_stopped: Callable[[Sequence[Partition]], None] = lambda _partitions: None,
    ) -> None:  # fmt: skip
        """`announce(shard, due_ms)` is called with the earliest due time of each shard
        written to, once per batch. Intake starts once `redis_checked` is set: Redis's
        eviction policy and the namespace's shard count were found right. `on_stopped` is
        told the intake partitions stopped because Redis lost their data (gaps.py)."""
        self.stopping = stopping
        self.redis_checked = redis_checked
        self.kafka = settings.kafka
        self.store_topic = settings.store_topic
        self.retention_needed = retention.intake_needed_ms(settings, caller_policy)
        self.outbox = answers_outbox(settings)
        self.placing: Outbox | None = None  # index mode's store writes (keeping.py)
        keeping = None
        if settings.store_topic and settings.storage_mode == "index":
            # Index mode: the references name where each version landed, which only a
            # producer reporting every record tells (the answers' reports only errors).
            def renew() -> Producer:
                return clients.new_producer(settings)

            self.placing = Outbox(renew(), settings.delivery_timeout + 1.0, renew)
            topic = StoreTopic(settings.store_topic, self.placing, metrics)
            keeping = Keeping(topic, store, indexing=True)
        elif settings.store_topic:
            keeping = Keeping(StoreTopic(settings.store_topic, self.outbox, metrics), store)
        self.topic_ids = clients.topic_id_lookup(settings.kafka)
        self.intake = Intake(
            clients.new_consumer(settings), store, self.outbox,
            intake_config_of(settings, caller_policy), metrics,
            incarnations=Incarnations(self.topic_ids, RedisRecord(store.client, store.layout)),
            guard=CrashGuard(store.client, store.layout.intake_handling),
            nonces=Nonces(store.client, store.layout), keeping=keeping,
            restating=(None if keeping is None
                       else Restating(store, keeping, settings.delivery_timeout)),
            on_scheduled=announce, on_refused_for_memory=room.intake_refused,
            on_stopped=on_stopped,
        )  # fmt: skip

    def loops(self) -> dict[str, Loop]:
        """The threads it needs, by name."""
        return {"intake": self._run}

    def _run(self) -> None:
        while not self.redis_checked.wait(POLL_SECONDS):
            if self.stopping.is_set():
                self.intake.consumer.close()
                return
        kept = [*self.intake.config.topics, self.intake.config.dlq_topic]  # a rebuild reads both
        retention.warn_if_short(self.kafka, kept, self.retention_needed, self.store_topic)
        if not self.stopping.is_set():  # each check may wait on Kafka for seconds
            replication.warn_if_weak(self.kafka, [*kept, self.intake.config.events_topic])
        self.intake.run(self.stopping)

    def stop(self) -> int:
        """After its thread ended (offsets committed): flush the answers and close the
        Kafka clients; how many answers could not be flushed."""
        self.topic_ids.close()
        if self.placing is not None:
            self.placing.close(1.0)  # what was written ahead was waited for already
        return self.outbox.close(1.0)

"""Backend: the service's parts the API's routes act on, wired once per service."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer

from blackbox.api.access import Access
from blackbox.api.admin import Admin
from blackbox.api.deadletters import DeadLetterTail
from blackbox.api.pending import Pending, PendingGauges
from blackbox.api.tokens import tokens_of
from blackbox.errors import SettingsError
from blackbox.firing.nudges import Nudge
from blackbox.health import Health
from blackbox.intake.keeping import Keeping
from blackbox.intake.policy import CallerPolicy
from blackbox.intake.runner import limits_of
from blackbox.kafka import clients
from blackbox.kafka.answers import Follower
from blackbox.kafka.outbox import Outbox
from blackbox.kafka.storetopic import StoreTopic
from blackbox.metrics import Metrics
from blackbox.settings import Settings
from blackbox.signing import Signer
from blackbox.storage.store import RedisStore

# Bodies are envelopes: the largest message, base64-encoded, plus room for the rest.
BODY_OVERHEAD_BYTES = 65_536


@dataclass(frozen=True, slots=True)
class Backend:
    """What the routes act on."""

    pending: Pending
    admin: Admin
    dead_letters: DeadLetterTail
    health: Health
    metrics: Metrics
    access: Access
    max_countdown_ms: int
    max_body_bytes: int
    topic_ids: clients.TopicIds  # the admin's look-up, closed with the rest
    answers: Follower | None = None  # None: changes are not waited for (tests of access)
    answer_seconds: float = 10.0
    body_seconds: float = 30.0  # a request's body must come in whole within this

    def close(self) -> None:
        """Flush the API's requests, then close every Kafka client the routes used."""
        self.admin.producer.flush(1.0)
        clients.close_producer(self.admin.producer)
        if self.admin.keeping is not None:
            self.admin.keeping.topic.outbox.close(1.0)
        self.topic_ids.close()
        self.dead_letters.close()
        if self.answers is not None:
            self.answers.close()


def _api_signer(settings: Settings) -> Signer | None:
    """The API's own signing key, where the settings name one."""
    if not settings.api_signing_key_file:
        return None
    try:
        pem = Path(settings.api_signing_key_file).read_bytes()
        return Signer.from_pem(pem, settings.api_key_id)
    except (OSError, ValueError) as e:
        raise SettingsError(f"BLACKBOX_API_SIGNING_KEY_FILE: {e}") from e


def _keeping(settings: Settings, store: RedisStore, metrics: Metrics) -> Keeping | None:
    """What writes the API's own changes to the store topic, where one is set (admin.py),
    with a producer of its own that reports every record (index mode's references name
    where each landed)."""
    if not settings.store_topic:
        return None

    def renew() -> Producer:
        return clients.new_producer(settings)

    outbox = Outbox(renew(), settings.delivery_timeout + 1.0, renew)
    topic = StoreTopic(settings.store_topic, outbox, metrics)
    return Keeping(topic, store, indexing=settings.storage_mode == "index")


def backend_of(  # noqa: PLR0913 - the service's parts the API acts on
    settings: Settings, store: RedisStore, health: Health, metrics: Metrics,
    on_scheduled: Nudge, *, caller_policy: CallerPolicy,
) -> Backend:  # fmt: skip
    """The API's parts for one service; the pending gauges join its metrics."""
    pending = Pending(store)
    metrics.registry.register(PendingGauges(pending))
    topic_ids = clients.topic_id_lookup(settings.kafka)
    admin = Admin(store, clients.new_producer(settings), settings.intake_topic,
                  settings.events_topic, limits_of(settings, caller_policy), topic_ids,
                  on_scheduled, policy=caller_policy, send_seconds=settings.delivery_timeout,
                  signer=_api_signer(settings),
                  keeping=_keeping(settings, store, metrics))  # fmt: skip
    answers = Follower(settings.kafka, settings.events_topic)
    answers.start()
    return Backend(
        pending=pending, admin=admin,
        dead_letters=DeadLetterTail(clients.consumer_config(settings), settings.dlq_topic),
        health=health, metrics=metrics,
        access=Access(settings.api_token, settings.api_reads == "open", settings.api_dev_open,
                      settings.api_allowed_hosts,
                      tokens_of("", settings.api_tokens_file)),
        max_countdown_ms=int(settings.max_countdown * 1000),
        max_body_bytes=settings.max_message_bytes * 2 + BODY_OVERHEAD_BYTES,
        topic_ids=topic_ids, answers=answers, answer_seconds=settings.delivery_timeout * 2,
        body_seconds=settings.http_body_timeout,
    )  # fmt: skip

"""Admin: the API's actions on schedules, answered on the events topic as intake answers.

A request about a caller's own id (cancel, reschedule, pause, resume) and a new schedule
(one-off or a series) are produced to the caller's intake topic (its own where the policy
binds one, else the shared one), keyed by the id, so they are applied in order with the
caller's records, under its policy. An id derived from an intake record has no later
records to race: cancel runs the intake's own cancel (the same Lua function, atomically)
and sends the same event an intake cancel sends; a reschedule sends `updated`. Beside a
store topic, what such a cancel or move left in Redis is then written to the store, as
intake writes what Redis holds after a request that did not do what it asked
(intake/keeping.py): a rebuild after a Redis loss restores the move and not the cancel.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import redis
import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from blackbox import envelope
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER, Header, Limits
from blackbox.firing.nudges import Nudge
from blackbox.intake.answering import OUTCOMES
from blackbox.intake.incarnations import Lookup, tag_of
from blackbox.intake.keeping import Keeping
from blackbox.intake.policy import CallerPolicy, open_policy
from blackbox.kafka.events import Event, Outcome
from blackbox.kafka.storetopic import StoreUnavailable
from blackbox.schedule import Schedule, intake_id, scoped_id
from blackbox.signing import Parts, Signer
from blackbox.storage.applying import Applied, Cancellation, Move, Write
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.api.admin")
SEND_SECONDS = 10.0
Coordinates = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Moved:
    """What a reschedule did: `schedule` as now stored when the outcome is `updated`."""

    outcome: Outcome
    schedule: Schedule | None


class Admin:
    """Cancel, reschedule and create, each answered like the intake answers."""

    def __init__(  # noqa: PLR0913, PLR0917 - its collaborators, each injected
        self,
        store: RedisStore,
        producer: Producer,
        intake_topic: str,
        events_topic: str,
        limits: Limits,
        lookup: Lookup,
        on_scheduled: Nudge = lambda _shard, _due_ms: None,
        *,
        policy: CallerPolicy | None = None,
        send_seconds: float = SEND_SECONDS,
        signer: Signer | None = None,
        keeping: Keeping | None = None,
    ) -> None:
        self.store = store
        self.producer = producer
        self.intake_topic = intake_topic
        self.events_topic = events_topic
        self.limits = limits
        self.lookup = lookup  # topic names -> ids: an intake-derived id names the incarnation
        self.on_scheduled = on_scheduled
        self.policy = policy or open_policy(float("inf"), limits.max_value_bytes)
        self._bound = {caller: topic for topic, caller in self.policy.bound_topics.items()}
        self.send_seconds = send_seconds
        self.signer = signer  # signs what the API sends for callers (see the README)
        self.keeping = keeping  # the store topic's writer, where one is set
        self._lock = threading.Lock()  # one produce-and-flush at a time

    def cancel(self, blackbox_id: str) -> Outcome:
        """cancelled, already_fired or not_found, with that event on the events topic."""
        code = self.store.cancel(blackbox_id)
        if code is Applied.CANCELLED:
            self._keep(Cancellation(blackbox_id))
        outcome = OUTCOMES[code]
        self._answer(Event.of_stored(outcome, blackbox_id, None))
        log.info("api_cancel", blackbox_id=blackbox_id, outcome=outcome.value)
        return outcome

    def reschedule(self, blackbox_id: str, due_ms: int) -> Moved:
        """Move a pending id to `due_ms`: updated (with its event), already_fired when it is
        being produced or was, cancelled or not_found."""
        code, schedule = self.store.reschedule(blackbox_id, due_ms, now_ms())
        outcome = OUTCOMES[code]
        if schedule is not None:
            self.on_scheduled(self.store.layout.shard_of(blackbox_id), due_ms)
            self._keep(Move(blackbox_id, schedule.caller, due_ms))
            self._answer(Event.of_stored(outcome, blackbox_id, schedule.caller,
                                         due_ms=due_ms, topic=schedule.topic))  # fmt: skip
        log.info("api_reschedule", blackbox_id=blackbox_id, outcome=outcome.value, due_ms=due_ms)
        return Moved(outcome, schedule)

    def _keep(self, write: Write) -> None:
        """Write to the store topic what `write` left in Redis (it changed Redis alone, no
        version of it written ahead). Best effort, once the change is made: a store left
        behind only restores the change's version before it, should Redis be lost."""
        if self.keeping is None:
            return
        try:
            self.keeping.after([(write, None)], threading.Event())
        except (StoreUnavailable, redis.RedisError, KafkaException) as e:
            log.error("api_change_not_stored", blackbox_id=write.id, error=str(e))

    def topic_for(self, caller: str | None) -> str:
        """The intake topic a caller's requests go to: its own, else the shared one."""
        return self.intake_topic if caller is None else self._bound.get(caller, self.intake_topic)

    def check_horizon(self, caller: str | None, due_ms: int) -> None:
        """Raise InvalidEnvelope when `caller` may not schedule that far ahead."""
        self.policy.check_horizon(None if caller is None else caller.encode(), due_ms, now_ms())

    def request(
        self, caller: bytes | None, own_id: str, document: dict[str, object]
    ) -> Coordinates:
        """Produce a request about the caller's own id as the caller would, keyed by the id;
        return where it landed (its answer names it)."""
        name = None if caller is None else caller.decode("utf-8")
        topic = self.topic_for(name)
        headers: list[Header] = [] if caller is None else [(CALLER_HEADER, caller)]
        value = orjson.dumps(document)
        delivered = self._send(
            topic, value, own_id.encode(), self._signed(topic, own_id.encode(), value, headers)
        )
        log.info("api_request", caller=name, id=own_id, topic=topic,
                 partition=delivered.partition(), offset=delivered.offset())  # fmt: skip
        return (topic, delivered.partition() or 0, delivered.offset() or 0)

    def create(
        self, caller: str | None, document: dict[str, object], context: Sequence[Header] = ()
    ) -> str:
        """Produce an envelope to the caller's intake topic as `caller`, with the request's
        trace `context` headers; return the id it will have.

        Raises InvalidEnvelope when the intake would dead-letter it for its form, a series
        whose end has passed included (the caller's policy is still the intake's to apply)."""
        value = orjson.dumps(document)
        headers: list[Header] = [] if caller is None else [(CALLER_HEADER, caller.encode())]
        request = envelope.parse(value, headers, self.limits)
        if isinstance(request, envelope.Envelope) and request.recurrence is not None:
            at = now_ms()  # the schedule the intake would build: its first occurrence
            Schedule.from_envelope(request, "api", received_ms=at, sent_ms=at)
        own = request.schedule_id
        topic = self.topic_for(caller)
        key = None if own is None else own.encode()
        sent = [*headers, *context]
        delivered = self._send(topic, value, key, self._signed(topic, key, value, sent))
        if own is not None:
            return scoped_id(None if caller is None else caller.encode("utf-8"), own)
        tag = tag_of(self.lookup([topic]).get(topic))
        return intake_id(topic, delivered.partition() or 0, delivered.offset() or 0, tag)

    def _signed(
        self, topic: str, key: bytes | None, value: bytes, headers: list[Header]
    ) -> list[Header]:
        """The headers of a request for a caller, signed by the API's key where it has one."""
        if self.signer is None or not any(name == CALLER_HEADER for name, _ in headers):
            return headers
        issued = now_ms()
        return [*headers, self.signer.header(Parts(topic, key, value, headers), issued_ms=issued)]

    def _answer(self, event: Event) -> None:
        record = event.record(self.events_topic, now_ms())
        self._send(record.topic, record.value, record.key, list(record.headers))

    def _send(
        self, topic: str, value: bytes | None, key: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> Message:  # fmt: skip
        """Produce one record and wait for the broker's acknowledgement."""
        reports: list[tuple[KafkaError | None, Message]] = []
        with self._lock:
            self.producer.produce(topic, value, key, headers=list(headers),
                                  on_delivery=lambda e, m: reports.append((e, m)))  # fmt: skip
            self.producer.flush(self.send_seconds)
        if not reports:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{topic}: no acknowledgement"))
        error, message = reports[0]
        if error is not None:
            raise KafkaException(error)
        return message

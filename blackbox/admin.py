"""Admin: an operator's actions on schedules, answered on the events topic as intake answers.

Cancel runs the intake's own cancel (the same Lua function, atomically) and sends the same
event an intake cancel sends; a reschedule sends `updated`; a new schedule is produced to
the intake topic, so the caller's policy, idempotency and answers are those of any
producer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from blackbox import envelope
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER, Limits
from blackbox.events import Event, Outcome
from blackbox.incarnations import Lookup, tag_of
from blackbox.intake import OUTCOMES
from blackbox.schedule import Schedule, intake_id, scoped_id
from blackbox.shares import Nudge
from blackbox.store import RedisStore

log = structlog.get_logger("blackbox.admin")
SEND_SECONDS = 10.0


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
    ) -> None:
        self.store = store
        self.producer = producer
        self.intake_topic = intake_topic
        self.events_topic = events_topic
        self.limits = limits
        self.lookup = lookup  # topic names -> ids: an intake-derived id names the incarnation
        self.on_scheduled = on_scheduled
        self._lock = threading.Lock()  # one produce-and-flush at a time

    def cancel(self, blackbox_id: str) -> Outcome:
        """cancelled, already_fired or not_found, with that event on the events topic."""
        outcome = OUTCOMES[self.store.cancel(blackbox_id)]
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
            self._answer(Event.of_stored(outcome, blackbox_id, schedule.caller,
                                         due_ms=due_ms, topic=schedule.topic))  # fmt: skip
        log.info("api_reschedule", blackbox_id=blackbox_id, outcome=outcome.value, due_ms=due_ms)
        return Moved(outcome, schedule)

    def create(self, caller: str | None, document: dict[str, object]) -> str:
        """Produce an envelope to the intake topic as `caller`; return the id it will have.

        Raises InvalidEnvelope when the intake would dead-letter it for its form (the
        caller's policy is still the intake's to apply)."""
        value = orjson.dumps(document)
        headers = [] if caller is None else [(CALLER_HEADER, caller.encode("utf-8"))]
        request = envelope.parse(value, headers, self.limits)
        own = request.schedule_id
        delivered = self._send(self.intake_topic, value, None if own is None else own.encode(),
                               headers)  # fmt: skip
        if own is not None:
            return scoped_id(None if caller is None else caller.encode("utf-8"), own)
        tag = tag_of(self.lookup([self.intake_topic]).get(self.intake_topic))
        return intake_id(self.intake_topic, delivered.partition() or 0, delivered.offset() or 0,
                         tag)  # fmt: skip

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
            self.producer.flush(SEND_SECONDS)
        if not reports:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{topic}: no acknowledgement"))
        error, message = reports[0]
        if error is not None:
            raise KafkaException(error)
        return message

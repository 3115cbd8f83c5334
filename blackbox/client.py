"""A small Python client: schedule and cancel messages through blackbox's intake topic.

    from blackbox.client import Client, Repeat

    with Client({"bootstrap.servers": "kafka:9092"}, caller="billing") as client:
        client.send_later("invoices", {"invoice": 42}, delay=3600, id="invoice-42")
        client.send_later("invoices", b"\\x00raw", at=datetime(2030, 1, 1, tzinfo=UTC))
        client.cancel("invoice-42")
        client.send_later("reports", "run", id="daily",
                          repeat=Repeat(cron="0 9 * * 1-5", timezone="Europe/Berlin"))
        client.pause("daily")
        client.resume("daily")

Sends are asynchronous; `flush()` (and leaving the `with` block) waits for the broker to
acknowledge every one and raises SendFailed if any was refused. What blackbox made of each
request arrives on the events topic (see `blackbox.kafka.events`).
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import orjson
from confluent_kafka import KafkaError, Message, Producer

from blackbox import retries, tracecontext
from blackbox.envelope import CALLER_HEADER, SIGNATURE_HEADER, Header, normalize_headers
from blackbox.errors import BlackboxError
from blackbox.recurrence import Missed
from blackbox.signing import Parts, Signer

DEFAULT_INTAKE_TOPIC = "blackbox"


class SendFailed(BlackboxError):
    """The broker refused (or never acknowledged) one or more requests."""

    def __init__(self, errors: list[KafkaError]) -> None:
        super().__init__(f"{len(errors)} requests not acknowledged: {errors[0].str()}")
        self.errors = errors


Seconds = float | timedelta
Moment = datetime | float


@dataclass(frozen=True, slots=True)
class Repeat:
    """When a series repeats: a `cron` rule read in `timezone` (IANA, default UTC), or
    `every` so many seconds; optional `start` and `end` (aware datetimes or epoch seconds),
    `limit` (how many runs), `jitter` (seconds of delay at most, the same each time an
    occurrence is computed), `missed` (what to do with occurrences missed while nothing
    could fire: skip, once (the default) or all) and `grace` (seconds late before an
    occurrence counts as missed). blackbox's intake checks the rule itself."""

    cron: str | None = None
    every: Seconds | None = None
    timezone: str | None = None
    start: Moment | None = None
    end: Moment | None = None
    limit: int | None = None
    jitter: Seconds | None = None
    missed: Missed | str | None = None
    grace: Seconds | None = None

    def fields(self) -> dict[str, Any]:
        """The envelope fields of the rule: only those given."""
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of cron and every")
        document: dict[str, Any] = {}
        for name in ("cron", "timezone", "limit"):
            if (value := getattr(self, name)) is not None:
                document[name] = value
        for name in ("every", "jitter", "grace"):
            if (value := getattr(self, name)) is not None:
                document[name] = _seconds(value, name)
        for name in ("start", "end"):
            if (value := getattr(self, name)) is not None:
                document[name] = _deliver_at(value, name)
        if self.missed is not None:
            document["missed"] = str(self.missed)  # a Missed is its value
        return document


def envelope(  # noqa: PLR0913 - the request's optional parts, each by name
    topic: str,
    message: Any,
    *,
    delay: float | timedelta | None = None,
    at: datetime | float | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    schedule_id: str | None = None,
    repeat: Repeat | None = None,
) -> dict[str, Any]:
    """The JSON-mode envelope for one schedule (or, with `repeat` and an id, a series):
    bytes go as `message_base64`."""
    if repeat is None and (delay is None) == (at is None):
        raise ValueError("give exactly one of delay and at")
    if repeat is not None and (delay is not None or at is not None or schedule_id is None):
        raise ValueError("a series has an id and repeat, neither delay nor at")
    document: dict[str, Any] = {"topic": topic}
    if isinstance(message, bytes | bytearray | memoryview):
        document["message_base64"] = base64.b64encode(bytes(message)).decode("ascii")
    else:
        document["message"] = message
    if repeat is not None:
        document |= repeat.fields()
    elif delay is not None:
        document["countdown"] = _seconds(delay, "delay")
    else:
        document["deliver_at"] = _deliver_at(at)  # type: ignore[arg-type]
    if key is not None:
        document["key"] = key
    if headers:
        document["headers"] = dict(headers)
    if schedule_id is not None:
        document["id"] = schedule_id
    return document


def _seconds(given: Seconds, name: str) -> float:
    seconds = given.total_seconds() if isinstance(given, timedelta) else float(given)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name} must be >= 0 seconds, not {given!r}")
    return seconds


def _deliver_at(at: Moment, name: str = "at") -> str | float:
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError(
                f"{name} must be timezone-aware (a naive datetime has no fixed instant)"
            )
        return at.isoformat()
    seconds = float(at)
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be a finite time, not {at!r}")
    return seconds


# A producer retrying after a broker failure may write a request twice unless idempotent:
# two intake records, two schedules. Keys are partitioned as Java's producers do (murmur2),
# so a schedule and its cancel sent from any language share a partition. The caller's own
# settings come after these.
_PRODUCER_DEFAULTS = {
    "enable.idempotence": "true",
    "acks": "all",
    "partitioner": "murmur2_random",
}


def producer_config(given: Mapping[str, str]) -> dict[str, str]:
    """The client's producer settings: idempotent with acks=all unless `given` says else."""
    return {**_PRODUCER_DEFAULTS, **given}


class Client:
    """Schedules and cancels through the intake topic, as one CALLER_SERVICE."""

    def __init__(
        self,
        producer: Producer | Mapping[str, str],
        *,
        caller: str | None = None,
        intake_topic: str = DEFAULT_INTAKE_TOPIC,
        signer: Signer | None = None,
        context: Callable[[], list[Header]] = tracecontext.current,
    ) -> None:
        """`signer` signs every request with the caller's key (see blackbox.signing), for
        callers whose policy requires it. Each request carries the W3C trace `context` it
        is sent in (OpenTelemetry's current one by default) to the delivered record."""
        self.producer = (
            producer if isinstance(producer, Producer) else Producer(producer_config(producer))
        )
        self.intake_topic = intake_topic
        self.caller = caller
        self.signer = signer
        self.context = context
        if signer is not None and caller is None:
            raise ValueError("a signed request must name its caller")
        self.failures: list[KafkaError] = []
        self.acknowledged = 0
        self.queue_wait_seconds = 30.0

    def send_later(  # noqa: PLR0913 - mirrors the envelope's optional parts
        self,
        topic: str,
        message: Any,
        *,
        delay: float | timedelta | None = None,
        at: datetime | float | None = None,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        repeat: Repeat | None = None,
    ) -> None:
        """Ask blackbox to deliver `message` to `topic` after `delay` or at `at`, or (with
        an `id`) at each occurrence of `repeat`.

        `message` may be bytes (delivered byte for byte), a string (its UTF-8 text) or any
        JSON value. With an `id`, sending again before it fires replaces it (an update); a
        series sent again replaces the series.
        """
        document = envelope(topic, message, delay=delay, at=at, key=key, headers=headers,
                            schedule_id=id, repeat=repeat)  # fmt: skip
        self.send_raw(orjson.dumps(document), id)

    def cancel(self, id: str) -> None:
        """Ask blackbox to cancel the pending schedule (or series) `id` of this caller."""
        self.send_raw(orjson.dumps({"id": id, "cancel": True}), id)

    def pause(self, id: str) -> None:
        """Ask blackbox to hold the series `id`: its occurrences are passed over until
        resumed (a one-off schedule is answered `not_recurring`)."""
        self.send_raw(orjson.dumps({"id": id, "pause": True}), id)

    def resume(self, id: str) -> None:
        """Ask blackbox to release the series `id`: it fires again from its next occurrence."""
        self.send_raw(orjson.dumps({"id": id, "resume": True}), id)

    def send_raw(self, value: bytes, schedule_id: str | None = None) -> None:
        """Produce one ready-made envelope to the intake topic, as this caller.

        A request with an id is keyed by it, so the schedule, its updates and its cancel
        share one intake partition and are applied in the order they were sent.
        """
        key = None if schedule_id is None else schedule_id.encode()
        self._produce(value, key, self.context())

    def retry(
        self,
        message: Message,
        error: str | BaseException,
        *,
        policy: str | Mapping[str, Any] | None = None,
    ) -> None:
        """Ask blackbox to deliver a consumed record again later, after a backoff: its
        value, key and headers byte for byte, to its topic (or the policy's `to`), with
        `blackbox-retry-attempt` counting attempts; after the last one, to the dead-letter
        topic (the policy's `dead_letter`, else the topic's name + ".dlq").

        `policy` names a backoff in the caller's policy file, or gives one: `{"delays":
        [5, 30, 300]}` or `{"base": 1, "factor": 2, "cap": 300, "attempts": 5, "jitter":
        "full"}`; without it the caller's `default` (else 1 s doubling to 300 s, 5
        attempts). Sending the same record's retry twice (a crash before the commit)
        schedules it once. See blackbox.retries.
        """
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if message.error() is not None:  # an event (end of partition, ...), not a record
            raise ValueError(f"retry() takes a record, not a consumer event: {message.error()}")
        if topic is None or partition is None or offset is None or offset < 0:
            raise ValueError("retry() takes a record read by a consumer (topic, partition, offset)")
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        headers = [
            (name, value)
            for name, value in normalize_headers(message.headers())
            if name not in (CALLER_HEADER, SIGNATURE_HEADER)
        ]
        headers += [
            (retries.ERROR_HEADER, text[: retries.MAX_ERROR_CHARS].encode(errors="replace")),
            (retries.SOURCE_HEADER, f"{topic}/{partition}/{offset}".encode()),
        ]
        if policy is not None:
            named = policy if isinstance(policy, str) else orjson.dumps(dict(policy)).decode()
            headers.append((retries.POLICY_HEADER, named.encode()))
        traced = any(name == "traceparent" for name, _ in headers)  # the record's own trace
        self._produce(message.value() or b"", message.key(), headers, with_context=not traced)

    def _produce(
        self, value: bytes, key: bytes | None, extra: list[Header], *, with_context: bool = False
    ) -> None:
        """Produce to the intake topic as this caller, signed when a signer is set: the
        caller's header, `extra`, then (`with_context`) the current trace context."""
        deadline = time.monotonic() + self.queue_wait_seconds
        headers: list[Header] = []
        if self.caller is not None:
            headers.append((CALLER_HEADER, self.caller.encode()))
        headers += extra
        if with_context:
            headers += self.context()
        if self.signer is not None:
            parts = Parts(self.intake_topic, key, value, headers)
            headers.append(self.signer.header(parts, issued_ms=time.time_ns() // 1_000_000))
        sent: list[tuple[str, str | bytes | None]] = [*headers]
        while True:
            try:
                self.producer.produce(
                    self.intake_topic, value, key, headers=sent, on_delivery=self._report
                )
                break
            except BufferError:  # the local queue is full: let the broker catch up
                if time.monotonic() > deadline:
                    raise
                self.producer.poll(0.1)
        self.producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for every request to be acknowledged; raise SendFailed if any was not."""
        left = self.producer.flush(timeout)
        failures, self.failures = self.failures, []
        if left:
            failures.append(KafkaError(KafkaError._TIMED_OUT, f"{left} requests unacknowledged"))
        if failures:
            raise SendFailed(failures)

    def _report(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.acknowledged += 1
        else:
            self.failures.append(error)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is None:
            self.flush()
        else:  # keep what was already sent; the error in hand is the one to report
            self.producer.flush(5.0)

"""Wait for blackbox's answer to one request, read from the events topic.

Mark the topic's end before sending, then wait: only events written after the mark count.
The reader assigns partitions itself (no consumer group), so it joins nothing and commits
nothing. `Follower` does the same for many waiters at once (the API's), matching each answer
to the intake record it answers.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

import orjson
import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

log = structlog.get_logger("blackbox.kafka.answers")


class Answers:
    """The events topic from a mark onwards."""

    def __init__(self, config: Mapping[str, str], topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                **config,
                "group.id": f"blackbox-answers-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )

    def mark(self, timeout: float = 10.0) -> None:
        """Start reading at the current end of every partition of the events topic."""
        metadata = self.consumer.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
        if metadata is None or metadata.error is not None:
            raise KafkaException(f"the events topic {self.topic!r} is not available")
        starts = []
        for partition in metadata.partitions:
            tp = TopicPartition(self.topic, partition)
            _, high = self.consumer.get_watermark_offsets(tp, timeout=timeout)
            starts.append(TopicPartition(self.topic, partition, high))
        self.consumer.assign(starts)
        self.partitions = len(starts)

    def follow_new_partitions(self, timeout: float = 5.0) -> None:
        """Read partitions added to the topic since the mark, from their beginning."""
        metadata = self.consumer.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
        if metadata is None or metadata.error is not None:
            return
        added = [TopicPartition(self.topic, p, OFFSET_BEGINNING)
                 for p in metadata.partitions if p >= self.partitions]  # fmt: skip
        if added:
            self.consumer.incremental_assign(added)
            self.partitions += len(added)

    def wait(
        self,
        caller: str | None,
        schedule_id: str,
        timeout: float,
        outcomes: frozenset[str] | None = None,
    ) -> dict[str, Any] | None:
        """The first event about the caller's `schedule_id` after the mark (with one of
        `outcomes`, when given); None at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in self.consumer.consume(100, timeout=0.2):
                if message.error() is not None or message.value() is None:
                    continue
                event: object = orjson.loads(message.value() or b"null")
                if isinstance(event, dict) and _about(event, caller, schedule_id, outcomes):
                    return event
        return None

    def close(self) -> None:
        self.consumer.close()


def _about(
    event: dict[str, Any], caller: str | None, schedule_id: str, outcomes: frozenset[str] | None
) -> bool:
    if (event.get("caller"), event.get("id")) != (caller, schedule_id):
        return False
    return outcomes is None or event.get("outcome") in outcomes


Coordinates = tuple[str, int, int]  # an intake record's topic, partition, offset
RECENT_ANSWERS = 10_000
# A follower no request was sent through for this long stops reading until the next one.
IDLE_SECONDS = 10.0
# How often the follower looks for partitions added to the events topic.
NEW_PARTITIONS_SECONDS = 10.0


class Follower:
    """The events topic from its end onwards, read on one thread: hands a waiter the answer
    to the intake record it names (by topic, partition and offset).

    Only answers keyed by an id someone is `expecting` are decoded (every other event is
    skipped by its key: the topic carries one answer per intake record). An answer read
    before its waiter waits is kept a while (the last RECENT_ANSWERS), so a request
    acknowledged by the broker just before its answer was read still gets it."""

    def __init__(self, config: Mapping[str, str], topic: str) -> None:
        self.answers = Answers(config, topic)
        self._lock = threading.Lock()
        self._waiting: dict[Coordinates, Future[dict[str, Any]]] = {}
        self._recent: OrderedDict[Coordinates, dict[str, Any]] = OrderedDict()
        self._stop = threading.Event()
        self._marked = threading.Event()
        self._expected: dict[bytes, int] = {}  # event keys (ids) -> requests awaiting them
        self._wanted = threading.Event()  # set: follow the topic (marked anew if resting)
        self._wanted.set()  # from the start: the first request finds it marked
        self._wanted_at = time.monotonic()  # the last `ready`
        self._thread = threading.Thread(target=self._run, name="answers", daemon=True)

    def start(self) -> None:
        """Follow from the topic's end, marked on the thread (the broker may be away)."""
        self._thread.start()

    def ready(self, timeout: float) -> bool:
        """Whether it follows the topic (a request sent from now on gets its answer): one
        resting since IDLE_SECONDS without a request marks the topic's end again first."""
        with self._lock:
            self._wanted_at = time.monotonic()
            self._wanted.set()
        return self._marked.wait(timeout)

    @property
    def following(self) -> bool:
        """Whether it reads the topic now (False while it rests, see IDLE_SECONDS)."""
        return self._marked.is_set()

    @contextmanager
    def expecting(self, key: bytes) -> Iterator[None]:
        """Around sending a request about the id `key` and waiting for its answer."""
        with self._lock:
            self._expected[key] = self._expected.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                if self._expected[key] == 1:
                    del self._expected[key]
                else:
                    self._expected[key] -= 1

    def wait(self, intake: Coordinates, timeout: float) -> dict[str, Any] | None:
        """The answer to the intake record at `intake`; None after `timeout` seconds."""
        with self._lock:
            known = self._recent.pop(intake, None)
            if known is not None:
                return known
            future = self._waiting.setdefault(intake, Future())
        try:
            return future.result(timeout)
        except FutureTimeout:
            return None
        finally:
            with self._lock:
                self._waiting.pop(intake, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(12.0)  # a mark in progress waits up to 10 s for the broker
        self.answers.close()

    def _run(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                self._follow()
            except (KafkaException, RuntimeError, orjson.JSONDecodeError) as e:
                if self._stop.is_set():  # closed while reading: nothing is waited for now
                    return
                log.warning("answers_unreadable", error=str(e), retry_in_s=delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def _follow(self) -> None:
        looked = time.monotonic()
        while not self._stop.is_set():
            if not self._marked.is_set():
                if not self._wanted.wait(0.5):
                    continue
                self.answers.mark(timeout=5.0)
                self._marked.set()
            if time.monotonic() - looked > NEW_PARTITIONS_SECONDS:
                self.answers.follow_new_partitions()
                looked = time.monotonic()
            expected = self._expected  # read without the lock: a dict lookup is atomic
            for message in self.answers.consumer.consume(100, timeout=0.2):
                if message.key() in expected and message.error() is None and message.value():
                    self._arrived(orjson.loads(message.value() or b"null"))
            self._rest_if_idle()

    def _rest_if_idle(self) -> None:
        """Stop reading once no request was sent for IDLE_SECONDS: the topic carries an
        answer per intake record, and reading them all for no one costs the broker a fetch
        and this process a decode per batch. The next `ready` marks the end again."""
        with self._lock:
            if self._expected or time.monotonic() - self._wanted_at < IDLE_SECONDS:
                return
            self._marked.clear()
            self._wanted.clear()
        self.answers.consumer.unassign()

    def _arrived(self, event: object) -> None:
        where = event.get("intake") if isinstance(event, dict) else None
        if not isinstance(where, dict) or not isinstance(event, dict):
            return
        intake = (where.get("topic"), where.get("partition"), where.get("offset"))
        with self._lock:
            future = self._waiting.pop(intake, None)  # type: ignore[arg-type]
            if future is not None:
                future.set_result(event)
                return
            self._recent[intake] = event  # type: ignore[index]
            while len(self._recent) > RECENT_ANSWERS:
                self._recent.popitem(last=False)

"""A consumer's retry: a record it failed to process, carried back to its topic later, byte
for byte, after a backoff; after its last attempt, to a dead-letter topic.

A retry request is a record on the intake topic whose value, key and headers are the
failed record's own (`Client.retry` builds it), plus:

    blackbox-retry-error    the error text (required: it marks the record as a retry)
    blackbox-retry-source   "topic/partition/offset" of the record that failed
    blackbox-retry-policy   a backoff as JSON, or the name of one in the caller's policy
                            (optional: the caller's `default` retry policy, else DEFAULT)

What blackbox delivered as a retry carries, besides the record's own headers:

    blackbox-retry-of       "topic/partition/offset" of the first failure's record
    blackbox-retry-attempt  this attempt's number (2 for the first retry)
    blackbox-retry-history  JSON: each failed attempt's number, time (epoch ms) and error

A request whose copied headers hold these goes on counting from them, so a record that
fails again is retried under its first coordinates and its next attempt. The retry's id
derives from those coordinates and the attempt, and is scheduled only if absent: a consumer
that crashes after sending a retry and before committing, and sends it again, schedules it
once. Every `blackbox-*` header of the request is read here and none is passed on; the
caller's and the signature's header are the request's own.

Pure: no I/O. The delay is computed where the request is applied (`resolve`), from the
caller's policy; its jitter is drawn from the retry's id, so a request sent twice waits the
same time.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from blackbox.errors import DeadLetterReason, InvalidEnvelope

ERROR_HEADER = "blackbox-retry-error"
SOURCE_HEADER = "blackbox-retry-source"
POLICY_HEADER = "blackbox-retry-policy"
OF_HEADER = "blackbox-retry-of"
ATTEMPT_HEADER = "blackbox-retry-attempt"
HISTORY_HEADER = "blackbox-retry-history"
DELIVERED_HEADERS = (OF_HEADER, ATTEMPT_HEADER, HISTORY_HEADER)
MAX_ERROR_CHARS = 1000  # an error text is cut to this many characters
MAX_HISTORY = 20  # failures kept in the history header: the first and the latest ones
MAX_ATTEMPTS = 1000
MAX_DELAY_SECONDS = 365.25 * 86400  # the caller's horizon bounds it further
DEAD_LETTER_SUFFIX = ".dlq"
_SOURCE = re.compile(r"([A-Za-z0-9._-]{1,249})/([0-9]{1,10})/([0-9]{1,19})")
_ID_PREFIX = "retry/"
_MAX_ID_CHARS = 255
_R = DeadLetterReason.INVALID_RETRY


@dataclass(frozen=True, slots=True)
class Source:
    """Where a failed record was read: its topic, partition and offset."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @classmethod
    def parse(cls, text: str, name: str) -> Source:
        match = _SOURCE.fullmatch(text)
        if match is None:
            raise InvalidEnvelope(_R, f"{name} must be 'topic/partition/offset', not {text[:80]!r}")
        return cls(match[1], int(match[2]), int(match[3]))


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before each attempt after a failure, and how many attempts in all.

    `delays` (seconds), when given, is the wait after each failure in turn, and the
    attempts are one more than its length. Otherwise the wait after failed attempt n is
    `base * factor ** (n - 1)` seconds, at most `cap`; with `jitter` ("full") a draw
    between 0 and that. `to` names the topic retries go to (the source's by default),
    `dead_letter` where a record goes after its last attempt (the source's topic + ".dlq");
    `same_partition` ("partition": "same") delivers each retry to the partition the failed
    record was first read from, whatever its key (else the key's partition, as before).
    """

    attempts: int = 5
    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: bool = False
    delays: tuple[float, ...] = ()
    to: str | None = None
    dead_letter: str | None = None
    same_partition: bool = False

    def delay_ms(self, failed: int, draw: float) -> int:
        """The wait after attempt `failed` (1 for the first) fails; `draw` in [0, 1)."""
        if self.delays:
            return round(self.delays[min(failed, len(self.delays)) - 1] * 1000)
        try:
            ceiling = min(self.cap, self.base * self.factor ** (failed - 1))
        except OverflowError:  # far past the cap
            ceiling = self.cap
        return round((ceiling * draw if self.jitter else ceiling) * 1000)

    @property
    def last_attempt(self) -> int:
        return len(self.delays) + 1 if self.delays else self.attempts

    @classmethod
    def from_document(cls, document: object) -> Backoff:
        """A backoff from its JSON or YAML mapping; ValueError says what is wrong."""
        if not isinstance(document, Mapping):
            raise ValueError("a backoff is an object")
        unknown = set(document) - _BACKOFF_FIELDS
        if unknown:
            raise ValueError(f"unknown backoff fields {sorted(unknown)}")
        if "delays" in document and set(document) & {"attempts", "base", "factor", "cap", "jitter"}:
            raise ValueError("give delays, or attempts/base/factor/cap/jitter, not both")
        fields = {_FIELD_NAMES.get(str(name), str(name)): _READERS[name](value, name)
                  for name, value in document.items() if value is not None}  # fmt: skip
        return cls(**fields)


DEFAULT = Backoff()


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt: its number, when blackbox took the retry request, the error."""

    attempt: int
    at_ms: int
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "at_ms": self.at_ms, "error": self.error}


# Not frozen: one is built per retry request on the intake path. Treat it as immutable.
@dataclass(slots=True)
class Retry:
    """What a retry request says: whose record failed, which attempt, why, and the backoff
    asked for (inline, by name in the caller's policy, or None: the caller's default)."""

    source: Source
    failed: int
    error: str
    policy: Backoff | str | None
    history: tuple[Failure, ...] = ()
    # Where the failed record was read (blackbox-retry-source), when the request says.
    read_from: Source | None = None
    exhausted: bool = False  # set when applied: past its last attempt, dead-lettered

    def id_for(self, topic: str) -> str:
        """The retry's id: the first failure's coordinates, the attempt it schedules, and
        the topic it goes to when that is not the record's own (each consumer group
        routing its retries to a topic of its own gets its own)."""
        plain = f"{_ID_PREFIX}{self.source}/{self.failed + 1}"
        if topic != self.source.topic:
            plain += f"/to/{topic}"
        if len(plain) <= _MAX_ID_CHARS:
            return plain
        digest = hashlib.sha256(plain.encode()).hexdigest()
        return f"{_ID_PREFIX}{digest}/{self.failed + 1}"

    def draw(self) -> float:
        """A number in [0, 1) that depends on the record and the attempt alone (the
        jitter's draw): a request sent twice waits the same time."""
        digest = hashlib.sha256(f"{self.source}/{self.failed}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True, slots=True)
class Plan:
    """What a retry request becomes: a delivery to `topic` after `delay_ms` with these
    blackbox headers, or (`exhausted`) a dead letter delivered at once."""

    topic: str
    delay_ms: int
    headers: tuple[tuple[str, bytes], ...]
    exhausted: bool
    id: str
    partition: int | None = None  # None: the key's partition, by the producer's partitioner


def is_request(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    """Whether a record's headers make it a retry request."""
    return any(name == ERROR_HEADER for name, _ in headers)


def read(
    headers: Sequence[tuple[str, bytes | None]],
) -> tuple[Retry, tuple[tuple[str, bytes | None], ...]]:
    """The retry a request's headers ask for, and the headers passed on with the record:
    its own, without any `blackbox-*` one. InvalidEnvelope(invalid_retry) says what is wrong."""
    own: dict[str, bytes] = {}
    passed: list[tuple[str, bytes | None]] = []
    for name, value in headers:
        if not name.lower().startswith("blackbox-"):
            passed.append((name, value))
        elif name in _READ:
            if name in own:
                raise InvalidEnvelope(_R, f"{name} is repeated")
            own[name] = b"" if value is None else value
    # Any bytes: an error text is what a worker caught, not worth refusing the retry for.
    error = own[ERROR_HEADER].decode("utf-8", "replace")[:MAX_ERROR_CHARS]
    read_from = None
    if SOURCE_HEADER in own:
        read_from = Source.parse(_text(own[SOURCE_HEADER], SOURCE_HEADER), SOURCE_HEADER)
    if OF_HEADER in own:  # a record blackbox delivered as a retry fails again
        source = Source.parse(_text(own[OF_HEADER], OF_HEADER), OF_HEADER)
        failed = _attempt_header(own.get(ATTEMPT_HEADER))
        history = _history(own.get(HISTORY_HEADER))
    elif read_from is not None:
        source, failed, history = read_from, 1, ()
    else:
        raise InvalidEnvelope(_R, f"a retry needs {SOURCE_HEADER}: 'topic/partition/offset'")
    policy = _policy(own.get(POLICY_HEADER))
    return Retry(source, failed, error, policy, history, read_from), tuple(passed)


def continued(retry: Retry, backoff: Backoff) -> Retry:
    """The retry as its count goes on; a new first failure where the record was read from
    a topic its retries never went to (its `blackbox-retry-*` headers copied along by a
    forwarding app: the count, and the id, belong to the record it was copied from)."""
    read_from = retry.read_from
    if read_from is None or read_from.topic in (retry.source.topic, backoff.to):
        return retry
    return Retry(read_from, 1, retry.error, retry.policy, (), read_from)


_READ = frozenset({
    ERROR_HEADER, SOURCE_HEADER, POLICY_HEADER, OF_HEADER, ATTEMPT_HEADER, HISTORY_HEADER,
})  # fmt: skip


def plan(retry: Retry, backoff: Backoff, received_ms: int) -> Plan:
    """Where and when the retry goes, by `backoff`, and the headers it is delivered with."""
    failures = (*retry.history, Failure(retry.failed, received_ms, retry.error))
    if len(failures) > MAX_HISTORY:  # the first failures and the latest ones
        half = MAX_HISTORY // 2
        failures = (*failures[:half], *failures[-half:])
    history = orjson.dumps([f.to_json() for f in failures])
    exhausted = retry.failed >= backoff.last_attempt
    attempt = retry.failed if exhausted else retry.failed + 1
    headers = (
        (OF_HEADER, str(retry.source).encode()),
        (ATTEMPT_HEADER, str(attempt).encode()),
        (HISTORY_HEADER, history),
    )
    if exhausted:
        topic = backoff.dead_letter or retry.source.topic + DEAD_LETTER_SUFFIX
        return Plan(topic, 0, headers, exhausted=True, id=retry.id_for(topic))
    topic = backoff.to or retry.source.topic
    delay_ms = backoff.delay_ms(retry.failed, retry.draw())
    partition = retry.source.partition if backoff.same_partition else None
    return Plan(topic, delay_ms, headers, exhausted=False, id=retry.id_for(topic),
                partition=partition)  # fmt: skip


def backoff_of(retry: Retry, named: Mapping[str, Backoff]) -> Backoff:
    """The backoff a retry asked for: inline, or named among the caller's (`named`); without
    a name the caller's `default`, else DEFAULT."""
    if isinstance(retry.policy, Backoff):
        return retry.policy
    if retry.policy is None:
        return named.get("default", DEFAULT)
    if retry.policy not in named:
        known = ", ".join(sorted(named)) or "none"
        raise InvalidEnvelope(
            _R, f"no retry policy {retry.policy[:80]!r} for this caller (it has: {known})"
        )
    return named[retry.policy]


def _policy(raw: bytes | None) -> Backoff | str | None:
    if raw is None:
        return None
    text = _text(raw, POLICY_HEADER).strip()
    if not text.startswith("{"):
        if not text or len(text) > 255 or not text.isprintable():
            raise InvalidEnvelope(_R, f"{POLICY_HEADER} must name a policy or be a JSON object")
        return text
    try:
        return Backoff.from_document(orjson.loads(text))
    except (orjson.JSONDecodeError, ValueError) as e:
        raise InvalidEnvelope(_R, f"{POLICY_HEADER}: {e}") from e


def _attempt_header(raw: bytes | None) -> int:
    if raw is None:
        raise InvalidEnvelope(_R, f"{OF_HEADER} without {ATTEMPT_HEADER}")
    text = _text(raw, ATTEMPT_HEADER)
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_ATTEMPTS:
        raise InvalidEnvelope(_R, f"{ATTEMPT_HEADER} must be 1-{MAX_ATTEMPTS}, not {text[:20]!r}")
    return int(text)


def _history(raw: bytes | None) -> tuple[Failure, ...]:
    if raw is None:
        return ()
    try:
        document = orjson.loads(raw)
        if not isinstance(document, list):
            raise TypeError("not a list")
        failures = tuple(_failure(f) for f in document[-MAX_HISTORY:])
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError) as e:
        raise InvalidEnvelope(_R, f"{HISTORY_HEADER} cannot be read: {e}") from e
    return failures


def _failure(document: Any) -> Failure:
    attempt, at_ms, error = document["attempt"], document["at_ms"], document["error"]
    whole = all(isinstance(n, int) and not isinstance(n, bool) for n in (attempt, at_ms))
    if not whole or not 1 <= attempt <= MAX_ATTEMPTS or not 0 <= at_ms < 2**53:
        raise ValueError(f"attempt {attempt!r} or at_ms {at_ms!r} out of range")
    if not isinstance(error, str):
        raise TypeError("error is not text")
    return Failure(attempt, at_ms, error[:MAX_ERROR_CHARS])


def _text(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidEnvelope(_R, f"{name} is not UTF-8") from e


def _delays(value: object) -> tuple[float, ...]:
    if not isinstance(value, list) or not value or len(value) >= MAX_ATTEMPTS:
        raise ValueError(f"delays must be a list of 1-{MAX_ATTEMPTS - 1} numbers of seconds")
    return tuple(_number(v, "delays", minimum=0) for v in value)


def _number(value: object, name: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number")
    if not minimum <= value <= MAX_DELAY_SECONDS:
        raise ValueError(f"{name} must be {minimum:g}-{MAX_DELAY_SECONDS:g}, not {value}")
    return float(value)


def _attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise ValueError(f"attempts must be a whole number 1-{MAX_ATTEMPTS}")
    return value


def _jitter(value: object) -> bool:
    if value not in ("full", "none", None):
        raise ValueError(f"jitter must be 'full' or 'none', not {value!r}")
    return value == "full"


def _topic(value: object, name: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", value):
        raise ValueError(f"{name} must be a topic name")
    return value


def _partition(value: object, _name: str) -> bool:
    if value != "same":
        raise ValueError(f"partition must be 'same', not {value!r}")
    return True


# Each field of a backoff's document, and how it is read (name -> value or ValueError).
_READERS: dict[str, Any] = {
    "delays": lambda v, _: _delays(v),
    "base": lambda v, n: _number(v, n, minimum=0),
    "factor": lambda v, n: _number(v, n, minimum=1.0),
    "cap": lambda v, n: _number(v, n, minimum=0),
    "attempts": lambda v, _: _attempts(v),
    "jitter": lambda v, _: _jitter(v),
    "to": _topic,
    "dead_letter": _topic,
    "partition": _partition,
}
_FIELD_NAMES = {"partition": "same_partition"}
_BACKOFF_FIELDS = frozenset(_READERS)

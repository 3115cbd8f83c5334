"""The error tree, and the closed set of reasons a record is dead-lettered for."""

from __future__ import annotations

import enum


class DeadLetterReason(enum.StrEnum):
    """Why a record went to the dead-letter topic: the `blackbox-dlq-reason` header value.

    The set is closed on purpose: it labels metrics and alerts, so it must stay small.
    """

    EMPTY_VALUE = "empty_value"
    OVERSIZED = "oversized"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    INVALID_COUNTDOWN = "invalid_countdown"
    INVALID_DELIVER_AT = "invalid_deliver_at"
    BEYOND_HORIZON = "beyond_horizon"
    CONFLICTING_FIELDS = "conflicting_fields"
    INVALID_ID = "invalid_id"
    INVALID_BASE64 = "invalid_base64"
    INVALID_TOPIC = "invalid_topic"
    FORBIDDEN_TOPIC = "forbidden_topic"
    INVALID_HEADER = "invalid_header"
    EXPIRED = "expired"
    UNKNOWN_TOPIC = "unknown_topic"
    RECORD_TOO_LARGE = "record_too_large"
    DELIVERY_FAILED = "delivery_failed"
    UNREADABLE = "unreadable"  # handling it failed in a way no check foresaw
    BAD_SIGNATURE = "bad_signature"  # missing where required, malformed, forged or replayed
    UNKNOWN_KEY = "unknown_key"  # signed with a key id the caller's policy does not list
    SIGNATURE_EXPIRED = "signature_expired"  # issued too long ago, or too far from its record
    UNVERIFIED_CALLER = "unverified_caller"  # names a bound caller outside its own topics
    INVALID_RECURRENCE = "invalid_recurrence"  # a cron, every, start/end, limit that cannot be
    UNKNOWN_TIMEZONE = "unknown_timezone"  # not an IANA time zone this machine knows
    OVER_QUOTA = "over_quota"  # its caller has as many schedules pending as its policy allows
    INVALID_RETRY = "invalid_retry"  # a retry whose source, attempt or backoff cannot be read
    # Index mode: its store record was not where Redis's reference said when it fell due.
    STORE_RECORD_MISSING = "store_record_missing"


class BlackboxError(Exception):
    """The root of every error blackbox raises on purpose."""


class InvalidEnvelope(BlackboxError):
    """An intake record that cannot be scheduled; it goes to the dead-letter topic."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        # What the record asked for, when it could be read: the answer names them.
        self.schedule_id: str | None = None
        self.topic: str | None = None


class SettingsError(BlackboxError):
    """A setting read from the environment is missing or malformed; the message names it."""


class CorruptSchedule(BlackboxError):
    """A stored schedule could not be decoded (written by something other than blackbox)."""


class StackError(BlackboxError):
    """A server of the local stack (Redis, a broker, Maven's jars) could not be had; the
    message names the cause and the way out."""


class EvictingRedis(SettingsError):
    """Redis may evict keys under memory pressure (its `maxmemory-policy` is not
    `noeviction`): an evicted payload is a lost schedule."""


class ShardsChanged(SettingsError):
    """BLACKBOX_SHARDS differs from the shard count the namespace's pending messages were
    written with: the ids would be looked for in the wrong shards."""


class StoreTopicRefused(SettingsError):
    """BLACKBOX_STORE_TOPIC names a topic that does not exist or is not compacted alone
    (`cleanup.policy=compact`): with `delete` in its policy, a schedule pending longer than
    its retention.ms loses the only version the store holds of it."""


class RedisUnreachable(BlackboxError):
    """No node of the Redis Cluster named by REDIS_URL answered: the cluster client cannot
    learn the slot map it needs to be built."""


class RedisFull(BlackboxError):
    """Redis refuses writes for memory (over `maxmemory`): intake waits, firing drains it."""


class ConcurrentUpdate(BlackboxError):
    """A schedule kept changing under an operation that compares and sets it; try again."""


class BadCursor(BlackboxError):
    """A listing cursor that this service did not hand out (or that was altered)."""


class SparkMissing(BlackboxError):
    """`blackbox spark ...` was run without the optional PySpark extra installed."""

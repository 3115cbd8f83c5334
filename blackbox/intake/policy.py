"""Per-caller policy: which topics each CALLER_SERVICE may schedule to, how far ahead, how large.

The policy is a YAML or JSON file named by BLACKBOX_POLICY_FILE:

    default:                      # callers not listed, and records without CALLER_SERVICE
      topics: []                  # may schedule nothing
    callers:
      billing:
        topics: [invoices, "billing.*"]   # exact names and shell-style patterns
        max_horizon_seconds: 2592000      # 30 days
        max_message_bytes: 65536
        max_pending: 100000               # schedules pending at once (quotas.py)
      payments:
        intake_topics: [blackbox.payments]  # records on it are payments' (Kafka ACLs decide)
      orders:
        topics: [orders, orders.dlq]
        retries:                          # backoffs a consumer's retry names (retries.py)
          default: {base: 1, factor: 2, cap: 300, attempts: 5, jitter: full}
          slow: {delays: [60, 600, 3600], dead_letter: orders.failed}
      reports:
        require_signature: true           # unsigned or forged records schedule nothing
        keys:                             # key id -> Ed25519 public key (base64 or PEM)
          reports-2026-11: "Gb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE="

A field left out falls back to the file's `default`, then to the service-wide settings
(BLACKBOX_MAX_COUNTDOWN, BLACKBOX_MAX_MESSAGE_BYTES). Without a file every caller may
schedule to any topic within those settings. The intake, events and dead-letter topics and
internal topics (`__*`) are never targets, whatever the policy says; nor is a bound intake
topic. `keys`, `require_signature` and the signature windows are explained in signing.py;
`intake_topics` binds a caller to its own intake topics: the service consumes them too, and
a record naming a bound caller anywhere else is refused unless signed by it. `retries` names
the backoffs a caller's retry requests may ask for (`default` when they name none); a
retry's target and dead-letter topics are checked against `topics` like any other.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from blackbox.envelope import ABSOLUTE_MAX_COUNTDOWN_SECONDS, Envelope, legal_topic_name
from blackbox.errors import DeadLetterReason, InvalidEnvelope, SettingsError
from blackbox.retries import Backoff
from blackbox.schedule import Series
from blackbox.signing import public_key_from_text, raw_public_key, valid_key_id

_RULE_FIELDS = frozenset({
    "topics", "max_horizon_seconds", "max_message_bytes", "require_signature", "keys",
    "signature_skew_seconds", "signature_max_age_seconds", "max_pending", "retries",
})  # fmt: skip
# How far a signature's issue time may lie from its record's timestamp (clocks differ),
# and how old it may be when read (its nonce is remembered that long against replays).
SIGNATURE_SKEW_SECONDS = 300.0
SIGNATURE_MAX_AGE_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class Rule:
    """What one caller may do."""

    topics: tuple[str, ...]
    max_horizon_seconds: float
    max_message_bytes: int
    require_signature: bool = False
    # Key id -> the public key's 32 raw bytes (plain bytes: a policy crosses to Spark's
    # workers by pickle, which key objects refuse).
    keys: Mapping[str, bytes] = field(default_factory=dict)
    signature_skew_seconds: float = SIGNATURE_SKEW_SECONDS
    signature_max_age_seconds: float = SIGNATURE_MAX_AGE_SECONDS
    intake_topics: tuple[str, ...] = ()
    # How many of its schedules may be pending at once (quotas.py); 0: no quota.
    max_pending: int = 0
    # The backoffs its retry requests may name (retries.py), "default" when they name none.
    retries: Mapping[str, Backoff] = field(default_factory=dict)

    def allows(self, topic: str) -> bool:
        return _matches(self.topics, topic)


@dataclass(frozen=True, slots=True)
class CallerPolicy:
    """The rule for each caller, and the default for everyone else."""

    default: Rule
    callers: Mapping[str, Rule] = field(default_factory=dict)

    @property
    def bound_topics(self) -> dict[str, str]:
        """Intake topic -> the caller it is bound to."""
        return {t: name for name, rule in self.callers.items() for t in rule.intake_topics}

    @property
    def longest_horizon_seconds(self) -> float:
        """The furthest ahead any caller may schedule."""
        return max(r.max_horizon_seconds for r in (self.default, *self.callers.values()))

    @property
    def counts_pending(self) -> bool:
        """Whether any rule sets a quota of pending schedules (quotas.py)."""
        return any(r.max_pending for r in (self.default, *self.callers.values()))

    @property
    def verifies(self) -> bool:
        """Whether any rule asks for identity: a signature, keys or a bound topic."""
        rules = [self.default, *self.callers.values()]
        return any(r.require_signature or r.keys or r.intake_topics for r in rules)

    def rule_for(self, caller: bytes | None) -> Rule:
        if caller is None:
            return self.default
        return self.callers.get(caller.decode("utf-8", "replace"), self.default)

    def horizon_ms(self, caller: bytes | None) -> int:
        """How far ahead the caller may schedule, in ms: each occurrence of its series too,
        when the one before fires (recurrence.fire)."""
        return int(self.rule_for(caller).max_horizon_seconds * 1000)

    def check(
        self, envelope: Envelope, due_ms: int, received_ms: int, series: Series | None = None
    ) -> None:
        """Raise InvalidEnvelope if the caller may not schedule this (`series`: the series
        it starts, whose occurrences must lie within the horizon of one another too)."""
        rule = self.rule_for(envelope.caller)
        who = _who(envelope.caller)
        if not rule.allows(envelope.topic):
            raise InvalidEnvelope(
                DeadLetterReason.FORBIDDEN_TOPIC,
                f"{who} may not schedule to {envelope.topic!r} (policy)",
            )
        if len(envelope.value) > rule.max_message_bytes:
            raise InvalidEnvelope(
                DeadLetterReason.OVERSIZED,
                f"message is {len(envelope.value)} bytes; {who} may send "
                f"at most {rule.max_message_bytes}",
            )
        self.check_horizon(envelope.caller, due_ms, received_ms)
        if series is not None:
            self._check_rhythm(envelope.caller, series)

    def _check_rhythm(self, caller: bytes | None, series: Series) -> None:
        """Raise InvalidEnvelope(beyond_horizon) if the series' first two occurrences, the
        jitter at its largest, lie further apart than the caller's horizon: its second would
        be stored beyond it when the first fires. For `every` that holds for every pair; a
        cron rule spaced unevenly ends when an occurrence would lie beyond (recurrence.py)."""
        rule = series.rule
        second = None if rule.limit == 1 else rule.after(series.occurrence_ms)
        if second is None:
            return
        apart = (second - series.occurrence_ms + rule.jitter_ms) / 1000
        horizon = self.rule_for(caller).max_horizon_seconds
        if apart > horizon:
            raise InvalidEnvelope(
                DeadLetterReason.BEYOND_HORIZON,
                f"occurrences {apart:.0f} s apart (jitter included); {_who(caller)} may "
                f"schedule at most {horizon:.0f} s ahead",
            )

    def check_horizon(self, caller: bytes | None, due_ms: int, received_ms: int) -> None:
        """Raise InvalidEnvelope if the caller may not schedule that far ahead."""
        rule = self.rule_for(caller)
        ahead = (due_ms - received_ms) / 1000
        if ahead > rule.max_horizon_seconds:
            raise InvalidEnvelope(
                DeadLetterReason.BEYOND_HORIZON,
                f"due {ahead:.0f} s ahead; {_who(caller)} may schedule at most "
                f"{rule.max_horizon_seconds:.0f} s ahead",
            )


def _who(caller: bytes | None) -> str:
    return "no caller" if caller is None else repr(caller.decode())


@functools.lru_cache(maxsize=4096)
def _matches(patterns: tuple[str, ...], topic: str) -> bool:
    """Whether a topic matches a pattern (cached: intake asks once per record)."""
    return any(fnmatch.fnmatchcase(topic, pattern) for pattern in patterns)


def open_policy(max_horizon_seconds: float, max_message_bytes: int) -> CallerPolicy:
    """The policy without a file: any topic, within the service-wide limits."""
    return CallerPolicy(Rule(("*",), max_horizon_seconds, max_message_bytes))


def load(path: str, base: CallerPolicy) -> CallerPolicy:
    """The policy in a YAML or JSON file, its gaps filled from `base`'s default rule."""
    try:
        text = Path(path).read_text("utf-8")
        document = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise SettingsError(f"BLACKBOX_POLICY_FILE {path!r} cannot be read: {e}") from e
    return from_document(document or {}, base, path)


def from_document(document: object, base: CallerPolicy, source: str = "policy") -> CallerPolicy:
    """Build a CallerPolicy from its parsed document; SettingsError names the faulty entry."""
    if not isinstance(document, dict) or set(document) - {"default", "callers"}:
        raise SettingsError(f"{source}: expected a mapping with 'default' and 'callers'")
    default = _rule(
        _or_empty(document.get("default")), base.default, f"{source}: default", is_default=True
    )
    callers = _or_empty(document.get("callers"))
    if not isinstance(callers, dict):
        raise SettingsError(f"{source}: 'callers' must map caller names to rules")
    rules = {
        str(name): _caller_rule(_or_empty(entry), default, f"{source}: callers.{name}")
        for name, entry in callers.items()
    }
    _check_bindings(rules, source)
    return CallerPolicy(default, rules)


def _caller_rule(entry: object, fallback: Rule, where: str) -> Rule:
    """A caller's rule: the default's fields, and the topics bound to it."""
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a mapping")
    rule = _rule({k: v for k, v in entry.items() if k != "intake_topics"}, fallback, where)
    if "intake_topics" in entry:
        names = _topics(entry["intake_topics"], where, "intake_topics")
        if not all(legal_topic_name(n) and not n.startswith("__") for n in names):
            raise SettingsError(f"{where}.intake_topics must be Kafka topic names, not patterns")
        rule = replace(rule, intake_topics=names)
    return rule


def _check_bindings(rules: Mapping[str, Rule], source: str) -> None:
    seen: dict[str, str] = {}
    for name, rule in rules.items():
        for topic in rule.intake_topics:
            if topic in seen:
                raise SettingsError(f"{source}: intake topic {topic!r} is bound to both "
                                    f"{seen[topic]!r} and {name!r}")  # fmt: skip
            seen[topic] = name


def _or_empty(entry: object) -> object:
    """An entry left empty in YAML (null) inherits everything; `[]`, `0` or `""` are errors."""
    return {} if entry is None else entry


def _rule(entry: object, fallback: Rule, where: str, *, is_default: bool = False) -> Rule:
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a mapping")
    unknown = set(entry) - _RULE_FIELDS
    if unknown:
        hint = " (intake_topics only under callers)" if "intake_topics" in unknown else ""
        raise SettingsError(f"{where} has unknown fields {sorted(unknown)}{hint}")
    rule = replace(fallback, intake_topics=())
    if "topics" in entry:
        rule = replace(rule, topics=_topics(entry["topics"], where))
    if "max_horizon_seconds" in entry:
        rule = replace(rule, max_horizon_seconds=_horizon(entry["max_horizon_seconds"], where))
    if "max_message_bytes" in entry:
        rule = replace(rule, max_message_bytes=_size(entry["max_message_bytes"], where))
    if "max_pending" in entry:
        rule = replace(rule, max_pending=_count(entry["max_pending"], where))
    if "retries" in entry:
        rule = replace(rule, retries=_retries(entry["retries"], where))
    return _signature_fields(entry, rule, where, is_default=is_default)


def _signature_fields(entry: dict[str, Any], rule: Rule, where: str, *, is_default: bool) -> Rule:
    if "require_signature" in entry:
        if not isinstance(entry["require_signature"], bool):
            raise SettingsError(f"{where}.require_signature must be true or false")
        rule = replace(rule, require_signature=entry["require_signature"])
    if "keys" in entry:
        rule = replace(rule, keys=_keys(entry["keys"], where))
    elif not is_default:  # a listed caller never signs with the default's keys
        rule = replace(rule, keys={})
    if "signature_skew_seconds" in entry:
        skew = _seconds(entry["signature_skew_seconds"], f"{where}.signature_skew_seconds")
        rule = replace(rule, signature_skew_seconds=skew)
    if "signature_max_age_seconds" in entry:
        age = _seconds(entry["signature_max_age_seconds"], f"{where}.signature_max_age_seconds")
        rule = replace(rule, signature_max_age_seconds=age)
    return rule


def _retries(value: Any, where: str) -> dict[str, Backoff]:
    if not isinstance(value, dict):
        raise SettingsError(f"{where}.retries must map policy names to backoffs")
    named = {}
    for name, document in value.items():
        if not isinstance(name, str) or not name or name.startswith("{") or len(name) > 255:
            raise SettingsError(f"{where}.retries: {name!r} is not a policy name")
        try:
            named[name] = Backoff.from_document(document)
        except ValueError as e:
            raise SettingsError(f"{where}.retries.{name}: {e}") from e
    return named


def _keys(value: Any, where: str) -> dict[str, bytes]:
    if not isinstance(value, dict):
        raise SettingsError(f"{where}.keys must map key ids to Ed25519 public keys")
    keys = {}
    for key_id, text in value.items():
        if not valid_key_id(str(key_id)):
            raise SettingsError(
                f"{where}.keys: {key_id!r} is not a key id (1-64 of A-Z a-z 0-9 . _ -)"
            )
        try:
            keys[str(key_id)] = raw_public_key(public_key_from_text(str(text)))
        except ValueError as e:
            raise SettingsError(f"{where}.keys.{key_id} is not an Ed25519 public key: {e}") from e
    return keys


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise SettingsError(f"{where} must be a number of seconds > 0")
    return float(value)


def _topics(value: Any, where: str, name: str = "topics") -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise SettingsError(f"{where}.{name} must be a list of topic names or patterns")
    return tuple(value)


def _horizon(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingsError(f"{where}.max_horizon_seconds must be a number of seconds")
    if not 0 <= value <= ABSOLUTE_MAX_COUNTDOWN_SECONDS:
        raise SettingsError(f"{where}.max_horizon_seconds must be 0 to 1,000 years")
    return float(value)


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"{where}.max_message_bytes must be a whole number >= 0")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise SettingsError(f"{where}.max_pending must be a whole number >= 0 (0: no quota)")
    return value

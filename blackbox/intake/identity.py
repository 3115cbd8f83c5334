"""Who sent an intake record, where the operator's policy asks to know.

Two ways, both from the policy file (policy.py):
- a caller's own intake topics (`intake_topics`): a record on one is that caller's,
  whatever its CALLER_SERVICE says (the header is replaced), so Kafka's authentication and
  ACLs decide who may write as whom. A record naming a bound caller on any other topic is
  refused as `unverified_caller`, unless the caller signed it;
- a signature (signing.py) by one of the caller's keys, required where the caller's rule
  says `require_signature`.

Pure: a verified signature's nonce is handed back, for the intake to check against
replays in Redis (nonces.py), with how long it must be remembered.

A signature's age is counted to the moment the intake reads the record, on every topic:
that is the only clock that bounds when a copy can still pass, so the nonce outlives every
copy however long the intake was away. On a LogAppendTime topic the broker's append time is
the record's timestamp and must lie within the skew of the issue time, so a captured record
cannot be appended again later; a backlog older than the maximum age when read is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from blackbox.envelope import CALLER_HEADER, Header, caller_of
from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.intake.policy import CallerPolicy, Rule
from blackbox.signing import SIGNATURE_HEADER, Parts, Signature, parse_header, verify

_R = DeadLetterReason


@dataclass(frozen=True, slots=True)
class Proof:
    """A verified signature: its nonce must not have been used by another record; it is
    remembered `remember_seconds` from now, and a countdown runs from `issued_ms`."""

    caller: str
    key_id: str
    nonce: str
    remember_seconds: int
    issued_ms: int

    def countdown_from(self, now_ms: int) -> int:
        """The instant a signed record's countdown runs from: the issue time its signature
        fixes (a relay may change the record's timestamp, not this), never later than now."""
        return min(self.issued_ms, now_ms)


class Identity:
    """Establishes the caller of each record under one policy."""

    def __init__(self, policy: CallerPolicy) -> None:
        self.policy = policy
        self.bound = policy.bound_topics
        self.bound_callers = set(self.bound.values())
        self.active = policy.verifies
        self._keys: dict[bytes, Ed25519PublicKey] = {}

    def applies_to(self, headers: Sequence[Header]) -> bool:
        """Whether a record with these headers must be checked at all: not under a policy
        without identity rules, unless the record is signed (then its signature must hold).
        The intake asks first, so an open deployment does nothing more per record."""
        return self.active or any(name == SIGNATURE_HEADER for name, _ in headers)

    def _key(self, raw: bytes) -> Ed25519PublicKey:
        """The key object of a policy's raw public key, built once."""
        key = self._keys.get(raw)
        if key is None:
            key = self._keys[raw] = Ed25519PublicKey.from_public_bytes(raw)
        return key

    def establish(
        self, parts: Parts, record_ms: int, now_ms: int
    ) -> tuple[Sequence[Header], Proof | None]:
        """The headers to parse the record with (its caller set where a topic is bound),
        and the proof of a valid signature; InvalidEnvelope when the caller is not proven
        where it must be.

        `record_ms` is the record's timestamp (the broker's append time on a LogAppendTime
        topic), `now_ms` the moment the intake reads it: the signature's age is counted to
        that, whatever stamps the topic (see the module's docstring)."""
        headers = parts.headers
        signed = [v for name, v in headers if name == SIGNATURE_HEADER]
        owner = self.bound.get(parts.topic)
        caller = owner or _caller_text(headers)
        rule = self.policy.rule_for(None if caller is None else caller.encode())
        proof = None
        if signed:
            proof = _checked(parts, signed, caller, rule, (record_ms, now_ms), key_of=self._key)
        elif owner is None and rule.require_signature:
            raise InvalidEnvelope(_R.BAD_SIGNATURE, f"{_who(caller)} must sign its records")
        elif owner is None and caller in self.bound_callers:
            raise InvalidEnvelope(
                _R.UNVERIFIED_CALLER,
                f"{caller!r} sends on its own intake topics only, or signed",
            )
        if owner is not None:
            headers = [(n, v) for n, v in headers if n != CALLER_HEADER]
            headers.append((CALLER_HEADER, owner.encode()))
        return headers, proof

    def recorded(self, parts: Parts, now_ms: int) -> tuple[Sequence[Header], Proof | None]:
        """As `establish`, for a record the intake accepted before (a rebuild): its caller
        taken as then (the topic's owner, else its CALLER_SERVICE), its signature's key,
        nonce and issue time read but not checked against today's keys and rules, which may
        have changed since (a key rotated out, a caller moved)."""
        headers = parts.headers
        signed = [v for name, v in headers if name == SIGNATURE_HEADER]
        owner = self.bound.get(parts.topic)
        caller = owner or _caller_text(headers)
        proof = None
        if signed:
            if len(signed) > 1 or signed[0] is None or caller is None:
                raise InvalidEnvelope(_R.BAD_SIGNATURE, "not one signature by a named caller")
            signature = parse_header(signed[0])
            rule = self.policy.rule_for(caller.encode())
            remember = _remember_seconds(signature.issued_ms, rule, now_ms)
            proof = Proof(caller, signature.key_id, signature.nonce, remember,
                          signature.issued_ms)  # fmt: skip
        if owner is not None:
            headers = [(n, v) for n, v in headers if n != CALLER_HEADER]
            headers.append((CALLER_HEADER, owner.encode()))
        return headers, proof


def _caller_text(headers: Sequence[Header]) -> str | None:
    raw = caller_of(headers)
    return None if raw is None else raw.decode()


def _who(caller: str | None) -> str:
    return "a record without CALLER_SERVICE" if caller is None else repr(caller)


def _checked(  # noqa: PLR0913 - the record, its claim, the rule, and how to read a key
    parts: Parts, signed: list[bytes | None], caller: str | None, rule: Rule,
    instants: tuple[int, int], *, key_of: Callable[[bytes], Ed25519PublicKey],
) -> Proof:  # fmt: skip
    """The proof of the one signature `signed` holds, checked against the caller's keys."""
    if len(signed) > 1 or signed[0] is None:
        raise InvalidEnvelope(_R.BAD_SIGNATURE, f"{SIGNATURE_HEADER} must appear once, valued")
    if caller is None:
        raise InvalidEnvelope(_R.BAD_SIGNATURE, "a signed record must name its CALLER_SERVICE")
    signature = parse_header(signed[0])
    raw = rule.keys.get(signature.key_id)
    if raw is None:
        raise InvalidEnvelope(
            _R.UNKNOWN_KEY, f"{caller!r} has no key {signature.key_id!r} in the policy"
        )
    _check_age(signature, rule, instants)
    verify(key_of(raw), signature, parts)
    remember = _remember_seconds(signature.issued_ms, rule, now_ms=instants[1])
    return Proof(caller, signature.key_id, signature.nonce, remember, signature.issued_ms)


def _remember_seconds(issued_ms: int, rule: Rule, now_ms: int) -> int:
    """How long from `now_ms` a nonce is kept: past the latest read time at which a copy
    could still pass (issued + max age), plus the skew another replica's clock may lag by."""
    window_ms = (rule.signature_max_age_seconds + rule.signature_skew_seconds) * 1000
    return max(1, math.ceil((issued_ms + window_ms - now_ms) / 1000)) + 1


def _check_age(signature: Signature, rule: Rule, instants: tuple[int, int]) -> None:
    """Issued near its record's timestamp, and young enough when read for its nonce to be
    known."""
    record_ms, now_ms = instants
    skew = abs(record_ms - signature.issued_ms) / 1000
    age = (now_ms - signature.issued_ms) / 1000
    if skew > rule.signature_skew_seconds:
        raise InvalidEnvelope(
            _R.SIGNATURE_EXPIRED,
            f"issued {skew:.0f} s from its record's timestamp; at most "
            f"{rule.signature_skew_seconds:.0f} s allowed",
        )
    if age < -rule.signature_skew_seconds:
        raise InvalidEnvelope(_R.SIGNATURE_EXPIRED, f"issued {-age:.0f} s in the future")
    if age > rule.signature_max_age_seconds:
        raise InvalidEnvelope(
            _R.SIGNATURE_EXPIRED,
            f"issued {age:.0f} s ago; at most {rule.signature_max_age_seconds:.0f} s allowed",
        )

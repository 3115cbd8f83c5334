"""Who sent an intake record: bound intake topics and signatures, under the policy file."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from blackbox import envelope
from blackbox.envelope import CALLER_HEADER, Header
from blackbox.errors import DeadLetterReason, InvalidEnvelope, SettingsError
from blackbox.intake import policy
from blackbox.intake.identity import Identity
from blackbox.intake.runner import caller_policy_of
from blackbox.settings import Settings
from blackbox.signing import Parts, Signer, public_text

NOW = 1_800_000_000_000
OLD_KEY, NEW_KEY = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
_R = DeadLetterReason


def _policy(**billing: object) -> policy.CallerPolicy:
    document = {
        "callers": {
            "billing": {"keys": {"old": public_text(OLD_KEY.public_key()),
                                 "new": public_text(NEW_KEY.public_key())}, **billing},
            "payments": {"intake_topics": ["blackbox.payments"]},
        }
    }  # fmt: skip
    return policy.from_document(document, policy.open_policy(3600, 1024))


def _record(caller: bytes | None = b"billing", topic: str = "blackbox") -> Parts:
    headers: list[Header] = [] if caller is None else [(CALLER_HEADER, caller)]
    return Parts(topic, b"id-1", b'{"id": "id-1"}', headers)


def _signed(parts: Parts, key: Ed25519PrivateKey = OLD_KEY, key_id: str = "old",
            issued_ms: int = NOW) -> Parts:  # fmt: skip
    header = Signer(key, key_id).header(parts, issued_ms=issued_ms)
    return Parts(parts.topic, parts.key, parts.value, [*parts.headers, header])


def _refusal(identity: Identity, parts: Parts, record_ms: int = NOW) -> DeadLetterReason:
    with pytest.raises(InvalidEnvelope) as raised:
        identity.establish(parts, record_ms, NOW)
    return raised.value.reason


def test_without_identity_rules_records_pass_untouched() -> None:
    """The open policy costs nothing and changes nothing."""
    identity = Identity(policy.open_policy(3600, 1024))
    parts = _record()
    assert not identity.applies_to(parts.headers)
    assert identity.establish(parts, NOW, NOW) == (parts.headers, None)
    assert identity.applies_to(_signed(parts).headers)  # a signature is checked anyway


def test_both_keys_of_a_rotation_are_valid_until_one_is_removed() -> None:
    """Guarantee 7: during a rotation both listed key ids verify; a removed one is unknown."""
    identity = Identity(_policy())
    for key, key_id in ((OLD_KEY, "old"), (NEW_KEY, "new")):
        _, proof = identity.establish(_signed(_record(), key, key_id), NOW, NOW)
        assert proof is not None and (proof.caller, proof.key_id) == ("billing", key_id)
    rotated = Identity(_policy(keys={"new": public_text(NEW_KEY.public_key())}))
    assert _refusal(rotated, _signed(_record())) is _R.UNKNOWN_KEY


def test_a_forged_caller_or_a_wrong_key_is_a_bad_signature() -> None:
    """Guarantee 7: a record signed by another key, or relabelled after signing, is refused."""
    identity = Identity(_policy())
    assert _refusal(identity, _signed(_record(), NEW_KEY, "old")) is _R.BAD_SIGNATURE
    signed = _signed(_record())
    relabelled = Parts(signed.topic, signed.key, signed.value,
                       [(CALLER_HEADER, b"payroll"), signed.headers[1]])  # fmt: skip
    assert _refusal(identity, relabelled) is _R.UNKNOWN_KEY  # payroll lists no key "old"


def test_a_required_signature_must_be_there() -> None:
    """Guarantee 7: with require_signature an unsigned record schedules nothing."""
    identity = Identity(_policy(require_signature=True))
    assert _refusal(identity, _record()) is _R.BAD_SIGNATURE
    assert identity.establish(_signed(_record()), NOW, NOW)[1] is not None


def test_a_default_requiring_signatures_refuses_every_unsigned_caller() -> None:
    """Guarantee 7: `default: {require_signature: true}` refuses unsigned records of any
    caller and of none."""
    strict = policy.from_document({"default": {"require_signature": True}},
                                  policy.open_policy(3600, 1024))  # fmt: skip
    identity = Identity(strict)
    assert _refusal(identity, _record(b"anyone")) is _R.BAD_SIGNATURE
    assert _refusal(identity, _record(None)) is _R.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("issued_ms", "record_ms"),
    [(NOW - 901_000, NOW - 901_000), (NOW, NOW - 301_000), (NOW + 301_000, NOW + 301_000)],
    ids=["too old", "far from its record", "from the future"],
)
def test_a_signature_outside_its_windows_has_expired(issued_ms: int, record_ms: int) -> None:
    """Guarantee 7: a replay outside the window (its nonce no longer remembered) is refused."""
    identity = Identity(_policy())
    parts = _signed(_record(), issued_ms=issued_ms)
    assert _refusal(identity, parts, record_ms) is _R.SIGNATURE_EXPIRED


def test_a_bound_topic_makes_its_records_the_callers_own() -> None:
    """Guarantee 7: a record on payments' own topic is payments', whatever CALLER_SERVICE
    says; naming payments on the shared topic is refused."""
    identity = Identity(_policy())
    headers, proof = identity.establish(_record(b"billing", "blackbox.payments"), NOW, NOW)
    assert list(headers) == [(CALLER_HEADER, b"payments")] and proof is None
    assert _refusal(identity, _record(b"payments")) is _R.UNVERIFIED_CALLER
    unnamed, _ = identity.establish(_record(None, "blackbox.payments"), NOW, NOW)
    assert list(unnamed) == [(CALLER_HEADER, b"payments")]


def test_a_signed_header_mode_record_is_parsed_without_its_signature() -> None:
    """Guarantee 7: an etf1 record signed by its caller schedules, and the signature header
    is not delivered (nor refused as a reserved header)."""
    headers: list[Header] = [(CALLER_HEADER, b"billing"), ("scheduler-epoch", b"1900000000"),
                             ("scheduler-target-topic", b"invoices"), ("trace", b"t1")]  # fmt: skip
    parts = _signed(Parts("blackbox", b"id-1", b"payload", headers))
    checked, proof = Identity(_policy()).establish(parts, NOW, NOW)
    request = envelope.parse(parts.value, checked, envelope.Limits(1024, frozenset()), parts.key)
    assert proof is not None and isinstance(request, envelope.Envelope)
    assert request.headers == (("trace", b"t1"),)


def test_a_listed_caller_never_signs_with_the_defaults_keys() -> None:
    """Guarantee 7: keys under `default` sign for unlisted callers only; a listed caller
    without keys of its own has none."""
    document = {"default": {"keys": {"old": public_text(OLD_KEY.public_key())}},
                "callers": {"billing": {"topics": ["*"]}}}  # fmt: skip
    identity = Identity(policy.from_document(document, policy.open_policy(3600, 1024)))
    assert _refusal(identity, _signed(_record())) is _R.UNKNOWN_KEY
    assert identity.establish(_signed(_record(b"stranger")), NOW, NOW)[1] is not None


def test_an_issue_time_beyond_fifteen_digits_is_a_bad_signature() -> None:
    """Guarantee 4: a huge issue time is refused as malformed, never an overflow."""
    parts = _signed(_record())
    name, value = parts.headers[-1]
    fields = (value or b"").split(b" ")
    fields[2] = b"9" * 400
    forged = Parts(
        parts.topic, parts.key, parts.value, [parts.headers[0], (name, b" ".join(fields))]
    )
    assert _refusal(Identity(_policy()), forged) is _R.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"default": {"intake_topics": ["x"]}}, "only under callers"),
        ({"callers": {"a": {"intake_topics": ["x"]}, "b": {"intake_topics": ["x"]}}},
         "bound to both"),
        ({"callers": {"a": {"intake_topics": ["x.*"]}}}, "not patterns"),
        ({"callers": {"a": {"intake_topics": ["bad topic!"]}}}, "topic names"),
        ({"callers": {"a": {"keys": {"a b": public_text(OLD_KEY.public_key())}}}}, "key id"),
        ({"callers": {"a": {"keys": {"k": "not a key"}}}}, "callers.a.keys.k"),
        ({"callers": {"a": {"require_signature": "yes"}}}, "require_signature"),
        ({"callers": {"a": {"signature_max_age_seconds": 0}}}, "signature_max_age_seconds"),
    ],
)  # fmt: skip
def test_identity_rules_with_mistakes_are_refused_at_start(document: object, message: str) -> None:
    """Bad identity rules stop the start with the entry named, never half-apply."""
    with pytest.raises(SettingsError, match=message):
        policy.from_document(document, policy.open_policy(3600, 1024))


def test_blackboxs_own_topics_cannot_be_bound_to_a_caller(tmp_path: Path) -> None:
    """Guarantee 4: binding the events, dead-letter or shared intake topic to a caller (a
    loop of dead letters and answers, or every sender relabelled) stops the start."""
    for own in ("blackbox", "blackbox.dlq", "blackbox.events"):
        path = tmp_path / "policy.yaml"
        path.write_text(f"callers:\n  oops:\n    intake_topics: [{own}]\n")
        settings = Settings.from_env({"BLACKBOX_POLICY_FILE": str(path)})
        with pytest.raises(SettingsError, match="own topics"):
            caller_policy_of(settings)


@pytest.mark.parametrize("issued_ms", [NOW - 900_000, NOW - 1, NOW, NOW + 300_000])
def test_a_nonce_outlives_every_copy_that_could_still_pass(issued_ms: int) -> None:
    """Guarantee 7: a signature accepted now has its nonce kept at least until the latest
    read time at which a copy could pass (issued + max age), plus the skew a replica's
    clock may lag by; a copy read after that is expired, whatever stamps its topic."""
    identity = Identity(_policy())
    _, proof = identity.establish(_signed(_record(), issued_ms=issued_ms), issued_ms, NOW)
    assert proof is not None and proof.issued_ms == issued_ms
    kept_until = NOW + proof.remember_seconds * 1000
    assert kept_until > issued_ms + (900 + 300) * 1000
    copy_read_late = issued_ms + 900_001  # appended within the windows, read too late
    with pytest.raises(InvalidEnvelope) as refused:
        identity.establish(_signed(_record(), issued_ms=issued_ms), issued_ms, copy_read_late)
    assert refused.value.reason is _R.SIGNATURE_EXPIRED


def test_a_signed_countdown_runs_from_the_issue_time_never_from_later_than_now() -> None:
    """Guarantee 7: the signature fixes when a countdown starts: its issue time, which a
    relay cannot change as it can a record's timestamp; one issued ahead of this clock
    (within the skew) runs from now, as an unsigned record's future timestamp does."""
    identity = Identity(_policy())
    _, proof = identity.establish(_signed(_record(), issued_ms=NOW - 5_000), NOW - 290_000, NOW)
    assert proof is not None and proof.countdown_from(NOW) == NOW - 5_000
    _, ahead = identity.establish(_signed(_record(), issued_ms=NOW + 5_000), NOW, NOW)
    assert ahead is not None and ahead.countdown_from(NOW) == NOW

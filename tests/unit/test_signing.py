"""Signed envelopes: the signed bytes, what a signature covers, and the worked example of
docs/SIGNING.md, checked byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from blackbox.envelope import CALLER_HEADER, Header
from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.signing import (
    SIGNATURE_HEADER,
    Parts,
    Signer,
    parse_header,
    public_key_from_text,
    public_text,
    signed_bytes,
    verify,
)

DOC = Path(__file__).parents[2] / "docs" / "SIGNING.md"


def _block(name: str) -> str:
    match = re.search(rf"```{name}\n(.*?)```", DOC.read_text("utf-8"), re.DOTALL)
    assert match is not None, name
    return match.group(1)


def _example() -> tuple[Signer, Parts]:
    seed = bytes.fromhex(_block("seed").strip())
    signer = Signer(Ed25519PrivateKey.from_private_bytes(seed), "billing-2026-11")
    value = _block("value").rstrip("\n").encode()
    parts = Parts("blackbox", b"invoice-42", value, [(CALLER_HEADER, b"billing")])
    return signer, parts


def test_the_worked_example_is_what_the_code_signs() -> None:
    """Guarantee 7: a non-Python producer following docs/SIGNING.md gets exactly the bytes,
    public key and header blackbox computes and verifies."""
    signer, parts = _example()
    issued, nonce = 1795600000000, "n0nce-0123456789abcdef"
    assert signed_bytes(parts, signer.key_id, issued, nonce).decode() == _block("signed")
    name, value = signer.header(parts, issued_ms=issued, nonce=nonce)
    assert f"{name}: {(value or b'').decode()}\n" == _block("header")
    public = public_text(signer.private_key.public_key())
    assert f'billing-2026-11: "{public}"' in _block("yaml")
    verify(public_key_from_text(public), parse_header(value or b""), parts)


def _signed(parts: Parts) -> tuple[Signer, list[Header]]:
    signer, _ = _example()
    header = signer.header(parts, issued_ms=1, nonce="abcdefghijklmnop")
    return signer, [*parts.headers, header]


TAMPERED = {
    "topic": lambda p: Parts("other", p.key, p.value, p.headers),
    "key": lambda p: Parts(p.topic, b"invoice-43", p.value, p.headers),
    "no key": lambda p: Parts(p.topic, None, p.value, p.headers),
    "value": lambda p: Parts(p.topic, p.key, (p.value or b"").replace(b"3600", b"3601"), p.headers),
    "tombstone": lambda p: Parts(p.topic, p.key, None, p.headers),
    "caller relabelled": lambda p: Parts(p.topic, p.key, p.value, [(CALLER_HEADER, b"other")]),
    "header added": lambda p: Parts(p.topic, p.key, p.value, [*p.headers, ("x", b"1")]),
    "header dropped": lambda p: Parts(p.topic, p.key, p.value, []),
    "header without value": lambda p: Parts(p.topic, p.key, p.value, [(CALLER_HEADER, None)]),
}


@pytest.mark.parametrize("change", TAMPERED.values(), ids=list(TAMPERED))
def test_a_signature_covers_every_part_blackbox_acts_on(change: object) -> None:
    """Guarantee 7: changing the topic, key, value, caller or any header breaks the
    signature (so no header can be relabelled under a valid one)."""
    signer, parts = _example()
    _, headers = _signed(parts)
    signature = parse_header(headers[-1][1] or b"")
    public = signer.private_key.public_key()
    verify(public, signature, Parts(parts.topic, parts.key, parts.value, headers))
    tampered = change(parts)  # type: ignore[operator]
    with pytest.raises(InvalidEnvelope) as raised:
        verify(public, signature, tampered)
    assert raised.value.reason is DeadLetterReason.BAD_SIGNATURE


@pytest.mark.parametrize(
    "raw",
    [b"", b"v1", b"v2 k 1 abcdefghijklmnop c2ln", b"v1 k x abcdefghijklmnop c2ln",
     b"v1 k 1 short c2ln", b"v1 k/1 1 abcdefghijklmnop c2ln", b"v1 k 1 abcdefghijklmnop !!",
     b"v1 k 1 abcdefghijklmnop c2ln extra", b"\xff\xfe"],
)  # fmt: skip
def test_a_malformed_signature_header_is_a_bad_signature(raw: bytes) -> None:
    """Guarantee 4: any bytes in the header give a clear refusal, never a crash."""
    with pytest.raises(InvalidEnvelope) as raised:
        parse_header(raw)
    assert raised.value.reason is DeadLetterReason.BAD_SIGNATURE


def test_the_signature_header_itself_is_not_signed() -> None:
    """The header is added last and left out of the signed bytes, wherever it stands."""
    _, parts = _example()
    with_header = Parts(parts.topic, parts.key, parts.value,
                        [(SIGNATURE_HEADER, b"x"), *parts.headers])  # fmt: skip
    assert signed_bytes(with_header, "k", 1, "n" * 16) == signed_bytes(parts, "k", 1, "n" * 16)


def test_a_key_id_outside_its_alphabet_is_refused() -> None:
    """Key ids appear in headers and Redis keys: spaces or colons are refused up front."""
    with pytest.raises(ValueError, match="key id"):
        Signer(Ed25519PrivateKey.generate(), "a b")

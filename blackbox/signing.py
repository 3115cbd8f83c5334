"""Signed envelopes: a caller proves an intake record is its own, whatever topic it is on.

A caller holds an Ed25519 private key; blackbox holds only the public keys, by key id, in
the policy file, so a leaked policy lets nobody sign and keys rotate by listing two ids
for a while. The signature rides in one header:

    blackbox-signature: v1 <key id> <issued at, epoch ms> <nonce> <signature, base64url>

and covers every byte blackbox acts on: the intake topic, the key id, the issue time, the
nonce, the record key, the value (which holds the operation, id, target topic, key, due
time and headers of a JSON envelope) and every other header of the record, in order (the
caller's name, and the etf1 headers a header-mode record is delivered with). So no header
can be relabelled, added or dropped under a valid signature. The signed bytes:

    blackbox-signature-v1\\n<topic>\\n<key id>\\n<issued ms>\\n<nonce>\\n
    <sha256(key) hex or ->\\n<sha256(value) hex or ->\\n
    <sha256(name) hex>:<sha256(value) hex or -> per header, each ending in \\n

Sign last, once every header is set. The issue time bounds replays (with the nonce, which
blackbox remembers while the signature is young enough to be accepted: see nonces.py), and
a signed countdown runs from it: the record's timestamp is not signed.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from blackbox.envelope import SIGNATURE_HEADER, Header
from blackbox.errors import DeadLetterReason, InvalidEnvelope

__all__ = ["SIGNATURE_HEADER", "Parts", "Signature", "Signer", "parse_header", "verify"]
VERSION = "v1"
_DOMAIN = b"blackbox-signature-v1"
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_ISSUED = re.compile(r"[0-9]{1,15}")  # epoch ms: 15 digits reach the year 33,658
_SIGNATURE = re.compile(r"[A-Za-z0-9_-]{86}")  # 64 bytes, base64url without padding
_R = DeadLetterReason


@dataclass(frozen=True, slots=True)
class Signature:
    """A parsed `blackbox-signature` header."""

    key_id: str
    issued_ms: int
    nonce: str
    signature: bytes


@dataclass(frozen=True, slots=True)
class Parts:
    """What a signature covers of one intake record (besides its own header's fields). Not
    its partition, chosen after signing: the intake takes a signed keyed record only on its
    key's partition (intake/placement.py)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header]


def signed_bytes(parts: Parts, key_id: str, issued_ms: int, nonce: str) -> bytes:
    """The bytes a signature is made over (see the module's docstring)."""
    lines = [_DOMAIN, parts.topic.encode(), key_id.encode(), str(issued_ms).encode(),
             nonce.encode(), _digest(parts.key), _digest(parts.value)]  # fmt: skip
    lines += [
        _digest(name.encode()) + b":" + _digest(header_value)
        for name, header_value in parts.headers
        if name != SIGNATURE_HEADER
    ]
    return b"\n".join(lines) + b"\n"


def _digest(data: bytes | None) -> bytes:
    return b"-" if data is None else hashlib.sha256(data).hexdigest().encode()


class Signer:
    """Signs intake records as one caller, with one of its keys."""

    def __init__(self, private_key: Ed25519PrivateKey, key_id: str) -> None:
        if not _KEY_ID.fullmatch(key_id):
            raise ValueError(f"a key id is 1-64 of A-Z a-z 0-9 . _ -, not {key_id!r}")
        self.private_key = private_key
        self.key_id = key_id

    @classmethod
    def from_pem(cls, pem: bytes, key_id: str) -> Signer:
        """A signer from a PKCS#8 PEM private key (what `blackbox keys new` writes)."""
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the signing key must be an Ed25519 private key")
        return cls(key, key_id)

    def header(self, parts: Parts, *, issued_ms: int, nonce: str | None = None) -> Header:
        """The `blackbox-signature` header for a record with these parts (append it last)."""
        nonce = nonce or secrets.token_urlsafe(16)
        data = signed_bytes(parts, self.key_id, issued_ms, nonce)
        signature = _b64(self.private_key.sign(data))
        text = f"{VERSION} {self.key_id} {issued_ms} {nonce} {signature}"
        return (SIGNATURE_HEADER, text.encode())


def valid_key_id(key_id: str) -> bool:
    return bool(_KEY_ID.fullmatch(key_id))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def parse_header(raw: bytes) -> Signature:
    """The header's parts; InvalidEnvelope(bad_signature) when it is malformed."""
    parts = raw.decode("ascii", "replace").split(" ")
    if len(parts) != 5 or parts[0] != VERSION:
        raise InvalidEnvelope(_R.BAD_SIGNATURE, f"{SIGNATURE_HEADER} is not 'v1 kid ms nonce sig'")
    _, key_id, issued, nonce, signature = parts
    well_formed = (_KEY_ID.fullmatch(key_id) and _NONCE.fullmatch(nonce)
                   and _ISSUED.fullmatch(issued) and _SIGNATURE.fullmatch(signature))  # fmt: skip
    if not well_formed:
        raise InvalidEnvelope(_R.BAD_SIGNATURE, f"{SIGNATURE_HEADER} has a malformed part")
    decoded = base64.urlsafe_b64decode(signature + "==")
    return Signature(key_id, int(issued), nonce, decoded)


def verify(public_key: Ed25519PublicKey, signature: Signature, parts: Parts) -> None:
    """Raise InvalidEnvelope(bad_signature) unless `signature` signs this record."""
    data = signed_bytes(parts, signature.key_id, signature.issued_ms, signature.nonce)
    try:
        public_key.verify(signature.signature, data)
    except InvalidSignature as e:
        raise InvalidEnvelope(
            _R.BAD_SIGNATURE, f"the signature does not match the record (key {signature.key_id})"
        ) from e


def public_key_from_text(text: str) -> Ed25519PublicKey:
    """A public key as the policy file holds it: base64 of its 32 raw bytes, or PEM."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_public_key(text.encode())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not an Ed25519 public key")
        return key
    raw = base64.b64decode(text, validate=True)
    return Ed25519PublicKey.from_public_bytes(raw)


def new_key_pair() -> tuple[bytes, str]:
    """A new private key (PKCS#8 PEM) and its public key (base64 of the raw 32 bytes)."""
    private = Ed25519PrivateKey.generate()
    return private_pem(private), public_text(private.public_key())


def private_pem(private: Ed25519PrivateKey) -> bytes:
    """The private key as `Signer.from_pem` reads it: PKCS#8 PEM, unencrypted."""
    return private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_text(public: Ed25519PublicKey) -> str:
    return base64.b64encode(raw_public_key(public)).decode()


def raw_public_key(public: Ed25519PublicKey) -> bytes:
    """The key's 32 raw bytes."""
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

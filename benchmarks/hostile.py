"""Hostile intake records: every way a producer can get the envelope wrong.

`records(count, seed)` yields (value, headers, expected reason or None) tuples; None means
any reason from the closed set will do (random binary garbage, for one).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import orjson

from blackbox.errors import DeadLetterReason as R

Header = tuple[str, str | bytes | None]
Hostile = tuple[bytes | None, list[Header], R | None]
MAX_BYTES = 4096  # the limit the chaos services run with (BLACKBOX_MAX_MESSAGE_BYTES)


def _envelope(rng: random.Random, **fields: object) -> bytes:
    document: dict[str, object] = {
        "topic": "hostile-target",
        "message": rng.random(),
        "countdown": 1,
    }
    document.update(fields)
    return orjson.dumps(document)


def _truncated(rng: random.Random) -> Hostile:
    whole = _envelope(rng)
    return whole[: rng.randrange(1, len(whole) - 1)], [], R.INVALID_JSON


def _invalid_json(rng: random.Random) -> Hostile:
    return rng.choice([b"{'topic': 1}", b"NaN", b"{,}", b"[1,]", b'{"a":1}}']), [], R.INVALID_JSON


def _wrong_types(rng: random.Random) -> Hostile:
    field, value, reason = rng.choice([
        ("countdown", "5", R.WRONG_TYPE), ("countdown", True, R.WRONG_TYPE),
        ("countdown", None, R.WRONG_TYPE), ("countdown", [1], R.WRONG_TYPE),
        ("topic", 7, R.WRONG_TYPE), ("topic", {"a": 1}, R.WRONG_TYPE),
    ])  # fmt: skip
    return _envelope(rng, **{field: value}), [], reason


def _bad_countdowns(rng: random.Random) -> Hostile:
    countdown = rng.choice([-1, -1e-9, -(10**15), 10**12, 1e300, 9.9e15])
    return _envelope(rng, countdown=countdown), [], R.INVALID_COUNTDOWN


def _deep_nesting(rng: random.Random) -> Hostile:
    depth = rng.randrange(1100, 1500)
    return b'{"message":' + b"[" * depth + b"]" * depth + b"}", [], R.INVALID_JSON


def _huge_string(rng: random.Random) -> Hostile:
    return _envelope(rng, message="x" * rng.randrange(MAX_BYTES, 3 * MAX_BYTES)), [], R.OVERSIZED


def _invalid_utf8(rng: random.Random) -> Hostile:
    return b'{"topic": "t\xff\xfe", "message": 1, "countdown": 1}', [], R.INVALID_JSON


def _bad_headers(rng: random.Random) -> Hostile:
    header = rng.choice([b"\xff\xfe", b"", b"a" * 300, None, b"tab\there"])
    return _envelope(rng), [("CALLER_SERVICE", header)], R.INVALID_HEADER


def _forbidden_topics(rng: random.Random) -> Hostile:
    topic, reason = rng.choice([
        ("__consumer_offsets", R.FORBIDDEN_TOPIC), ("__transaction_state", R.FORBIDDEN_TOPIC),
        ("has space", R.INVALID_TOPIC), ("", R.INVALID_TOPIC), ("..", R.INVALID_TOPIC),
        ("t" * 250, R.INVALID_TOPIC), ("ünïcode", R.INVALID_TOPIC),
    ])  # fmt: skip
    return _envelope(rng, topic=topic), [], reason


def _garbage(rng: random.Random) -> Hostile:
    return rng.randbytes(rng.randrange(1, 200)), [], None


def _shapes(rng: random.Random) -> Hostile:
    value, reason = rng.choice([
        (b"[]", R.NOT_AN_OBJECT), (b'"text"', R.NOT_AN_OBJECT), (b"42", R.NOT_AN_OBJECT),
        (b"{}", R.MISSING_FIELD), (b'{"topic": "t", "countdown": 1}', R.MISSING_FIELD),
        (None, R.EMPTY_VALUE),
    ])  # fmt: skip
    return value, [], reason


KINDS: list[Callable[[random.Random], Hostile]] = [
    _truncated,
    _invalid_json,
    _wrong_types,
    _bad_countdowns,
    _deep_nesting,
    _huge_string,
    _invalid_utf8,
    _bad_headers,
    _forbidden_topics,
    _garbage,
    _shapes,
]


def records(count: int, seed: int = 5) -> Iterator[Hostile]:
    """`count` hostile records, every kind in turn, with seeded variety inside each kind."""
    rng = random.Random(seed)
    for n in range(count):
        yield KINDS[n % len(KINDS)](rng)

"""W3C trace context carried with a schedule: pure, no I/O.

A request's trace context is three record headers (W3C Trace Context and Baggage):
``traceparent``, ``tracestate`` and ``baggage``. blackbox keeps them with the schedule among
its headers, under their own names, so the delivered record carries them byte for byte and
a stored schedule reads the same in every release. Each is validated where the request
comes in: a malformed one (or one repeated) is dropped and counted, never a reason to
refuse the request. A ``tracestate`` without a valid ``traceparent`` is dropped too (the
W3C rule: it belongs to the parent it came with).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from blackbox.envelope import Header

TRACEPARENT, TRACESTATE, BAGGAGE = "traceparent", "tracestate", "baggage"
TRACE_HEADERS = (TRACEPARENT, TRACESTATE, BAGGAGE)
_NAMES = frozenset(TRACE_HEADERS)
# version-traceid-parentid-flags, lower-case hex; a later version may append "-...".
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
_TRACEPARENT_BYTES = 55
_ZERO_TRACE, _ZERO_SPAN = b"0" * 32, b"0" * 16
_MAX_TRACESTATE_BYTES, _MAX_TRACESTATE_MEMBERS = 512, 32
_KEY = r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TRACESTATE_MEMBER = re.compile(f"({_KEY})=({_VALUE})")
_MAX_BAGGAGE_BYTES, _MAX_BAGGAGE_MEMBERS = 8192, 180
_KEYCHARS = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_BAGGAGE_MEMBER = re.compile(
    rf"[ \t]*{_KEYCHARS}[ \t]*=[ \t]*[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*"
    rf"(?:;[ \t]*{_KEYCHARS}[ \t]*(?:=[ \t]*[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*)?[ \t]*)*"
)


@dataclass(frozen=True, slots=True)
class Carried:
    """The valid trace headers of a request, and the names of those dropped as malformed."""

    headers: tuple[Header, ...] = ()
    dropped: tuple[str, ...] = ()


NOTHING = Carried()


def valid_traceparent(raw: bytes) -> bool:
    """A W3C traceparent: version 00 exactly, a later one with its known prefix."""
    match = _TRACEPARENT.fullmatch(raw)
    if match is None or match[1] == b"ff":
        return False
    if match[1] == b"00" and len(raw) != _TRACEPARENT_BYTES:
        return False
    return match[2] != _ZERO_TRACE and match[3] != _ZERO_SPAN


def valid_tracestate(raw: bytes) -> bool:
    """A W3C tracestate: at most 32 `key=value` members, unique keys, at most 512 bytes."""
    if len(raw) > _MAX_TRACESTATE_BYTES or not raw.isascii():
        return False
    members = [m.strip(" \t") for m in raw.decode("ascii").split(",")]
    keys = []
    for member in filter(None, members):
        match = _TRACESTATE_MEMBER.fullmatch(member)
        if match is None:
            return False
        keys.append(match[1])
    return len(keys) <= _MAX_TRACESTATE_MEMBERS and len(set(keys)) == len(keys)


def valid_baggage(raw: bytes) -> bool:
    """W3C baggage: `key=value[;property]` members, at most 180, at most 8,192 bytes."""
    if not raw or len(raw) > _MAX_BAGGAGE_BYTES or not raw.isascii():
        return False
    members = raw.decode("ascii").split(",")
    return len(members) <= _MAX_BAGGAGE_MEMBERS and all(
        _BAGGAGE_MEMBER.fullmatch(m) for m in members
    )


_VALID = {TRACEPARENT: valid_traceparent, TRACESTATE: valid_tracestate, BAGGAGE: valid_baggage}


def carried(headers: Iterable[Header]) -> Carried:
    """The trace context of a request's headers: each valid header once, in the W3C order;
    a malformed or repeated one dropped (and named in `dropped`)."""
    for name, _ in headers:  # most records have none: one plain pass, nothing built
        if name in _NAMES:
            break
    else:
        return NOTHING
    found: dict[str, list[bytes | None]] = {}
    for name, value in headers:
        if name in _NAMES:
            found.setdefault(name, []).append(value)
    if not found:
        return NOTHING
    kept: list[Header] = []
    dropped: list[str] = []
    for name in TRACE_HEADERS:
        values = found.get(name)
        if values is None:
            continue
        value = values[0]
        ok = len(values) == 1 and value is not None and _VALID[name](value)
        if ok and name == TRACESTATE and not kept[:1]:
            ok = False  # a tracestate is only meaningful beside its traceparent
        if ok:
            kept.append((name, value))
        else:
            dropped.append(name)
    return Carried(tuple(kept), tuple(dropped))


def with_context(own: tuple[Header, ...], context: tuple[Header, ...]) -> tuple[Header, ...]:
    """A message's headers with a request's trace context: the context's headers replace
    the message's own of the same names."""
    if not context:
        return own
    names = {name for name, _ in context}
    return (*(h for h in own if h[0] not in names), *context)


def without_context(headers: Sequence[Header]) -> list[Header]:
    """The headers without a parent: no traceparent, no tracestate (baggage stays)."""
    return [h for h in headers if h[0] != TRACEPARENT and h[0] != TRACESTATE]


def traceparent_of(headers: Sequence[Header]) -> bytes | None:
    """The traceparent among stored headers (valid: it was checked on the way in)."""
    for name, value in headers:
        if name == TRACEPARENT:
            return value
    return None


def ids_of(traceparent: bytes) -> tuple[str, str]:
    """The (trace id, span id) a traceparent names, as hex text for log lines."""
    return traceparent[3:35].decode("ascii"), traceparent[36:52].decode("ascii")


def current() -> list[Header]:
    """The caller's current trace context through OpenTelemetry's propagators (a producer
    instrumented with OpenTelemetry); none where the OpenTelemetry API is not installed."""
    try:
        from opentelemetry import propagate  # noqa: PLC0415
    except ImportError:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(name, carrier[name].encode("ascii")) for name in TRACE_HEADERS if name in carrier]


def from_environment(environ: Mapping[str, str]) -> list[Header]:
    """The context a process was started in: the TRACEPARENT, TRACESTATE and BAGGAGE
    variables (OpenTelemetry's environment carrier), else its current context."""
    found: list[Header] = [(name, environ[name.upper()].encode()) for name in TRACE_HEADERS
             if environ.get(name.upper())]  # fmt: skip
    return found or current()

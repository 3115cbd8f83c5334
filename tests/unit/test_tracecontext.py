"""W3C trace context carried with a schedule: what is kept, what is dropped (and named)."""

from __future__ import annotations

import pytest

from blackbox import tracecontext
from blackbox.tracecontext import BAGGAGE, TRACEPARENT, TRACESTATE

PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "raw",
    [
        PARENT,
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later-fields",
        b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09",
    ],
)
def test_a_w3c_traceparent_is_valid(raw: bytes) -> None:
    """Version 00 exactly, and a later version with the known prefix (W3C's forward rule)."""
    assert tracecontext.valid_traceparent(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"garbage",
        PARENT + b"-",  # version 00 has exactly four fields
        PARENT.upper(),  # lower-case hex only
        b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff forbidden
        b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
        b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        b"\xff\xfe",
        PARENT + b"\n",
    ],
)
def test_a_malformed_traceparent_is_refused(raw: bytes) -> None:
    """What W3C says a receiver must not continue from."""
    assert not tracecontext.valid_traceparent(raw)


def test_tracestate_and_baggage_are_checked_by_their_grammars() -> None:
    """tracestate: key=value members, unique keys, at most 32 and 512 bytes; baggage:
    key=value[;properties] members, at most 180 and 8,192 bytes."""
    assert tracecontext.valid_tracestate(b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    assert tracecontext.valid_tracestate(b"tenant@vendor=x , other=y")
    assert not tracecontext.valid_tracestate(b"a=1,a=2")
    assert not tracecontext.valid_tracestate(b"Upper=1")
    assert not tracecontext.valid_tracestate(b"k=1=2x,=")
    assert not tracecontext.valid_tracestate(",".join(f"k{n}=v" for n in range(33)).encode())
    assert tracecontext.valid_baggage(b"userId=alice,serverNode=DF%2028,isProduction=false")
    assert tracecontext.valid_baggage(b"key1=value1;property1;property2=x")
    assert not tracecontext.valid_baggage(b"no-equals")
    assert not tracecontext.valid_baggage(b"k=v" + b"x" * 8200)
    assert not tracecontext.valid_baggage(b"k=\xe9")


def test_carried_keeps_the_valid_headers_byte_for_byte_in_w3c_order() -> None:
    """Other headers are ignored; the three come out as they came in."""
    headers = [("CALLER_SERVICE", b"billing"), (BAGGAGE, b"a=1"), (TRACESTATE, b"x=y"),
               (TRACEPARENT, PARENT)]  # fmt: skip
    carried = tracecontext.carried(headers)
    assert carried.headers == ((TRACEPARENT, PARENT), (TRACESTATE, b"x=y"), (BAGGAGE, b"a=1"))
    assert carried.dropped == ()
    assert tracecontext.carried([("CALLER_SERVICE", b"x")]) is tracecontext.NOTHING


def test_malformed_repeated_or_orphaned_headers_are_dropped_and_named() -> None:
    """A malformed, value-less or repeated header is dropped; a tracestate without a valid
    traceparent too (it belongs to its parent); baggage stands alone."""
    carried = tracecontext.carried([(TRACEPARENT, b"00-bad"), (TRACESTATE, b"x=y"),
                                    (BAGGAGE, b"a=1")])  # fmt: skip
    assert carried.headers == ((BAGGAGE, b"a=1"),)
    assert carried.dropped == (TRACEPARENT, TRACESTATE)
    twice = tracecontext.carried([(TRACEPARENT, PARENT), (TRACEPARENT, PARENT), (BAGGAGE, None)])
    assert twice.headers == ()
    assert twice.dropped == (TRACEPARENT, BAGGAGE)


def test_the_requests_context_replaces_the_messages_own_trace_headers() -> None:
    """A message's own headers of the same names give way to the record's context; without
    a context the message's headers stay as they are."""
    own = (("traceparent", b"old"), ("x", b"1"))
    context = ((TRACEPARENT, PARENT),)
    assert tracecontext.with_context(own, context) == (("x", b"1"), (TRACEPARENT, PARENT))
    assert tracecontext.with_context(own, ()) is own
    assert tracecontext.without_context([*own, (BAGGAGE, b"a=1")]) == [
        ("x", b"1"),
        (BAGGAGE, b"a=1"),
    ]


def test_a_process_context_comes_from_its_environment() -> None:
    """TRACEPARENT, TRACESTATE and BAGGAGE (OpenTelemetry's environment carrier)."""
    environ = {"TRACEPARENT": PARENT.decode(), "BAGGAGE": "a=1", "PATH": "/bin"}
    assert tracecontext.from_environment(environ) == [(TRACEPARENT, PARENT), (BAGGAGE, b"a=1")]
    assert tracecontext.ids_of(PARENT) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")

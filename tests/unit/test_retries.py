"""A consumer's retry request read and planned: pure, no processes (retries.py)."""

from __future__ import annotations

import orjson
import pytest

from blackbox import envelope, retries
from blackbox.envelope import CALLER_HEADER, SIGNATURE_HEADER, Envelope, Limits
from blackbox.errors import DeadLetterReason, InvalidEnvelope, SettingsError
from blackbox.intake import policy, retrying, targets
from blackbox.intake.policy import CallerPolicy
from blackbox.retries import Backoff, Retry, Source

LIMITS = Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset({"blackbox"}))
AT = 1_800_000_000_000
Headers = list[tuple[str, bytes | None]]
BAD_HISTORIES = [
    b"[{}]",
    b'{"attempt": 1}',
    b"[1]",
    b'[{"attempt": 1e400, "at_ms": 1, "error": ""}]',  # infinity
    b'[{"attempt": 1, "at_ms": 99999999999999999999999, "error": ""}]',  # past 64 bits
    b'[{"attempt": true, "at_ms": 1, "error": ""}]',
    b'[{"attempt": 1, "at_ms": 1, "error": 5}]',
]


def request(*extra: tuple[str, bytes | None], source: bytes = b"orders/3/41") -> Headers:
    """A first failure's request: the record's own headers, the caller, then the retry's."""
    return [
        ("trace-me", b"\xff\xfe"),
        (CALLER_HEADER, b"orders-worker"),
        ("empty", None),
        (retries.ERROR_HEADER, b"db locked"),
        (retries.SOURCE_HEADER, source),
        *extra,
    ]


def parsed(
    headers: Headers, value: bytes = b"\x00payload", key: bytes | None = b"k\xff"
) -> Envelope:
    result = envelope.parse(value, headers, LIMITS, key)
    assert isinstance(result, Envelope)
    return result


def reason(headers: Headers) -> str:
    with pytest.raises(InvalidEnvelope) as caught:
        parsed(headers)
    return f"{caught.value.reason.value}: {caught.value.detail}"


def test_a_request_keeps_value_key_and_the_records_own_headers_byte_for_byte() -> None:
    got = parsed(request())
    assert got.value == b"\x00payload" and got.key == b"k\xff"
    assert got.headers == (("trace-me", b"\xff\xfe"), ("empty", None))  # no caller, no blackbox-*
    assert got.caller == b"orders-worker"
    assert got.retry is not None and got.retry.source == Source("orders", 3, 41)
    assert (got.retry.failed, got.retry.error, got.retry.policy) == (1, "db locked", None)
    assert got.schedule_id == "retry/orders/3/41/2" and got.if_absent


def test_a_retry_delivered_before_goes_on_from_its_first_coordinates_and_attempt() -> None:
    history = orjson.dumps([{"attempt": 1, "at_ms": AT, "error": "db locked"}])
    headers = request(
        ("blackbox-id", b"@x"),
        ("blackbox-attempt", b"1"),
        (retries.OF_HEADER, b"orders/0/7"),
        (retries.ATTEMPT_HEADER, b"2"),
        (retries.HISTORY_HEADER, history),
        source=b"orders/1/900",  # where the retry itself was read
    )
    got = parsed(headers)
    assert got.retry is not None and got.retry.source == Source("orders", 0, 7)
    assert got.retry.failed == 2 and len(got.retry.history) == 1
    assert got.schedule_id == "retry/orders/0/7/3"
    assert all(not name.startswith("blackbox-") for name, _ in got.headers)


def test_the_signature_header_is_the_requests_own_and_never_passed_on() -> None:
    got = parsed(request((SIGNATURE_HEADER, b"v1 k 1 n s")))
    assert SIGNATURE_HEADER not in dict(got.headers)


@pytest.mark.parametrize(
    ("extra", "source", "expected"),
    [
        ((), b"orders/3", "needs blackbox-retry-source"),
        ((), b"orders/x/1", "topic/partition/offset"),
        ((), b"bad topic/1/1", "topic/partition/offset"),
        (((retries.ERROR_HEADER, b"again"),), b"orders/1/1", "repeated"),
        (((retries.POLICY_HEADER, b'{"delays": []}'),), b"orders/1/1", "delays must be"),
        (((retries.POLICY_HEADER, b'{"base": 1, "delays": [1]}'),), b"orders/1/1", "not both"),
        (((retries.POLICY_HEADER, b'{"speed": 1}'),), b"orders/1/1", "unknown backoff"),
        (((retries.POLICY_HEADER, b'{"attempts": 0}'),), b"orders/1/1", "attempts must"),
        (((retries.POLICY_HEADER, b'{"jitter": "half"}'),), b"orders/1/1", "jitter must"),
        (((retries.POLICY_HEADER, b'{"to": "no such/topic"}'),), b"orders/1/1", "topic name"),
        (((retries.POLICY_HEADER, b"\xff"),), b"orders/1/1", "not UTF-8"),
        (((retries.OF_HEADER, b"orders/1/1"),), b"orders/1/1", "without"),
        (((retries.OF_HEADER, b"o/1/1"), (retries.ATTEMPT_HEADER, b"0")), b"o/1/1", "must be 1"),
        (((retries.OF_HEADER, b"o/1/1"), (retries.ATTEMPT_HEADER, b"\xd9\xa3")), b"o/1/1", "must"),
        *[
            (
                (
                    (retries.OF_HEADER, b"o/1/1"),
                    (retries.ATTEMPT_HEADER, b"1"),
                    (retries.HISTORY_HEADER, history),
                ),
                b"o/1/1",
                "cannot be read",
            )
            for history in BAD_HISTORIES
        ],
    ],
)
def test_a_request_that_cannot_be_read_is_invalid_retry_saying_why(
    extra: tuple[tuple[str, bytes], ...], source: bytes, expected: str
) -> None:
    headers = request(*extra, source=source)
    if source == b"orders/3":  # no usable source at all: drop the header
        headers = [h for h in headers if h[0] != retries.SOURCE_HEADER]
    got = reason(headers)
    assert got.startswith("invalid_retry: ") and expected in got, got


def test_an_exponential_backoff_doubles_up_to_its_cap_and_full_jitter_draws_below() -> None:
    backoff = Backoff(base=1, factor=2, cap=10, attempts=6)
    assert [backoff.delay_ms(n, 0.5) for n in range(1, 6)] == [1000, 2000, 4000, 8000, 10000]
    jittered = Backoff(base=1, factor=2, cap=10, jitter=True)
    assert jittered.delay_ms(3, 0.25) == 1000 and jittered.delay_ms(3, 0.0) == 0
    assert Backoff(base=1, factor=2, cap=300).delay_ms(10_000, 0.5) == 300_000  # no overflow


def test_a_list_of_delays_gives_each_wait_and_the_number_of_attempts() -> None:
    backoff = Backoff.from_document({"delays": [5, 30, 300]})
    assert [backoff.delay_ms(n, 0.9) for n in (1, 2, 3)] == [5000, 30_000, 300_000]
    assert backoff.last_attempt == 4


def plan_for(headers: Headers, named: dict[str, Backoff] | None = None) -> retries.Plan:
    got = parsed(headers)
    assert got.retry is not None
    return retries.plan(got.retry, retries.backoff_of(got.retry, named or {}), AT)


def test_the_plan_counts_the_attempt_and_keeps_every_failure() -> None:
    planned = plan_for(request())
    assert (planned.topic, planned.delay_ms, planned.exhausted) == ("orders", 1000, False)
    headers = dict(planned.headers)
    assert headers[retries.OF_HEADER] == b"orders/3/41"
    assert headers[retries.ATTEMPT_HEADER] == b"2"
    assert orjson.loads(headers[retries.HISTORY_HEADER]) == [
        {"attempt": 1, "at_ms": AT, "error": "db locked"}
    ]


def test_past_the_last_attempt_it_goes_to_the_dead_letter_topic_at_once() -> None:
    history = orjson.dumps([{"attempt": 1, "at_ms": AT - 5, "error": "first"}])
    headers = request(
        (retries.OF_HEADER, b"orders/3/41"),
        (retries.ATTEMPT_HEADER, b"2"),
        (retries.HISTORY_HEADER, history),
        (retries.POLICY_HEADER, b'{"delays": [5]}'),
    )
    planned = plan_for(headers)
    assert (planned.topic, planned.delay_ms, planned.exhausted) == ("orders.dlq", 0, True)
    errors = [f["error"] for f in orjson.loads(dict(planned.headers)[retries.HISTORY_HEADER])]
    assert errors == ["first", "db locked"]
    named = {"x": Backoff(delays=(5.0,), dead_letter="orders.failed")}
    assert plan_for([*headers[:-1], (retries.POLICY_HEADER, b"x")], named).topic == "orders.failed"


def test_a_policy_is_named_from_the_callers_and_an_unknown_name_is_refused() -> None:
    named = {"default": Backoff(delays=(7.0,)), "slow": Backoff(delays=(60.0,), to="orders.slow")}
    assert plan_for(request(), named).delay_ms == 7000
    slow = plan_for(request((retries.POLICY_HEADER, b"slow")), named)
    assert (slow.topic, slow.delay_ms) == ("orders.slow", 60_000)
    with pytest.raises(InvalidEnvelope, match=r"no retry policy 'fast'.*default, slow"):
        plan_for(request((retries.POLICY_HEADER, b"fast")), named)


def test_the_jitter_is_drawn_from_the_id_so_a_request_sent_twice_waits_the_same() -> None:
    jitter = (retries.POLICY_HEADER, b'{"base": 100, "cap": 100, "jitter": "full"}')
    first, again = plan_for(request(jitter)), plan_for(request(jitter))
    other = plan_for(request(jitter, source=b"orders/3/42"))
    assert first.delay_ms == again.delay_ms
    assert first.delay_ms != other.delay_ms
    assert 0 <= first.delay_ms < 100_000


def test_a_long_topic_name_still_gives_an_id_within_the_limit() -> None:
    retry = Retry(Source("t" * 249, 2**31 - 1, 2**63 - 1), 999, "e", None)
    for topic in ("t" * 249, "other"):
        made = retry.id_for(topic)
        assert len(made) <= 255 and made.startswith("retry/") and made.endswith("/1000")
    assert retry.id_for("a") != retry.id_for("b")


def test_the_history_keeps_the_first_and_the_latest_failures() -> None:
    failures = tuple(retries.Failure(n, AT + n, f"e{n}") for n in range(1, 31))
    retry = Retry(Source("o", 0, 0), 31, "last", Backoff(attempts=100), failures)
    kept = orjson.loads(
        dict(retries.plan(retry, Backoff(attempts=100), AT).headers)[retries.HISTORY_HEADER]
    )
    assert len(kept) == retries.MAX_HISTORY
    assert kept[0]["attempt"] == 1 and kept[-1] == {"attempt": 31, "at_ms": AT, "error": "last"}


def test_resolving_checks_the_planned_topic_like_any_target() -> None:
    rule = policy.open_policy(3600, 1_000_000).default
    with pytest.raises(InvalidEnvelope) as caught:  # the intake topic is never a target
        retrying.resolved(parsed(request(source=b"blackbox/0/1")), rule, AT, LIMITS)
    assert caught.value.reason is DeadLetterReason.FORBIDDEN_TOPIC
    got = retrying.resolved(parsed(request()), rule, AT, LIMITS)
    assert (got.topic, got.countdown_ms) == ("orders", 1000)
    assert got.headers[:2] == (("trace-me", b"\xff\xfe"), ("empty", None))
    assert [name for name, _ in got.headers[2:]] == list(retries.DELIVERED_HEADERS)


def test_the_policy_file_reads_named_backoffs_and_refuses_bad_ones() -> None:
    base = policy.open_policy(3600, 1_000_000)
    document = {"callers": {"w": {"retries": {"default": {"delays": [1, 2]}, "slow": {"base": 5}}}}}
    rules: CallerPolicy = policy.from_document(document, base)
    assert rules.rule_for(b"w").retries["default"].last_attempt == 3
    assert rules.rule_for(b"w").retries["slow"].base == 5
    for bad, said in [({"x": {"delays": "1"}}, "delays must"), ([1], "must map"),
                      ({"{x": {}}, "not a policy name")]:  # fmt: skip
        with pytest.raises(SettingsError, match=said):
            policy.from_document({"callers": {"w": {"retries": bad}}}, base)


def test_the_reason_is_in_the_closed_set() -> None:
    assert DeadLetterReason("invalid_retry") is DeadLetterReason.INVALID_RETRY


def test_a_rebuild_looks_first_at_every_topic_a_retry_may_go_to() -> None:
    """intake/targets.py: the source topic and the dead-letter one, or those an inline
    backoff names; nothing for a request that cannot be read."""
    assert targets._retry_targets(request()) == ["orders", "orders.dlq"]
    routed = request((retries.POLICY_HEADER, b'{"to": "o.retry", "dead_letter": "o.failed"}'))
    assert targets._retry_targets(routed) == ["o.retry", "o.failed"]
    assert targets._retry_targets(request(source=b"bad")) == []


def test_an_error_text_of_any_bytes_is_kept_readable_not_refused() -> None:
    got = parsed([(retries.ERROR_HEADER, b"disk \xff full"), (retries.SOURCE_HEADER, b"o/0/1")])
    assert got.retry is not None and got.retry.error == "disk \ufffd full"


def test_each_topic_a_retry_goes_to_gets_its_own_id() -> None:
    """Two consumer groups of one caller, each routing its retries to a topic of its own:
    two retries, not one answered already_pending."""
    to_a = plan_for(request((retries.POLICY_HEADER, b'{"delays": [1], "to": "orders.a"}')))
    to_b = plan_for(request((retries.POLICY_HEADER, b'{"delays": [1], "to": "orders.b"}')))
    own = plan_for(request((retries.POLICY_HEADER, b'{"delays": [1]}')))
    assert own.id == "retry/orders/3/41/2"
    assert to_a.id == "retry/orders/3/41/2/to/orders.a" and to_b.id != to_a.id


def test_retry_headers_forwarded_to_another_topic_start_a_new_count() -> None:
    """A record delivered as a retry and copied by an app, headers and all, to another
    topic, fails there: its retry is its own (first failure, back to where it was read),
    not the next attempt of the record it was copied from."""
    history = orjson.dumps([{"attempt": 1, "at_ms": AT, "error": "x"}])
    copied = (
        (retries.OF_HEADER, b"up/0/0"),
        (retries.ATTEMPT_HEADER, b"2"),
        (retries.HISTORY_HEADER, history),
    )
    got = parsed(request(*copied, source=b"down/1/9"))
    assert got.retry is not None
    backoff = Backoff(delays=(1.0, 1.0))
    own = retries.continued(got.retry, backoff)
    assert (own.source, own.failed, own.history) == (Source("down", 1, 9), 1, ())
    planned = retries.plan(own, backoff, AT)
    assert (planned.topic, planned.id) == ("down", "retry/down/1/9/2")
    back_home = parsed(request(*copied, source=b"up/2/5"))  # read where its retries go
    assert back_home.retry is not None
    assert retries.continued(back_home.retry, backoff).source == Source("up", 0, 0)
    routed = Backoff(delays=(1.0,), to="down")  # or its own retry topic
    assert retries.continued(got.retry, routed).source == Source("up", 0, 0)


def test_a_steep_backoff_stops_at_its_cap_however_many_attempts() -> None:
    backoff = Backoff(base=1, factor=1000, cap=60, attempts=1000)
    assert backoff.delay_ms(999, 0.5) == 60_000


def test_a_tombstone_with_retry_headers_is_refused_not_taken_for_a_cancel() -> None:
    with pytest.raises(InvalidEnvelope) as caught:
        envelope.parse(None, request(), LIMITS, b"customer-42")
    assert caught.value.reason is DeadLetterReason.INVALID_RETRY


def test_partition_same_sends_each_retry_where_the_record_was_first_read() -> None:
    same = plan_for(request((retries.POLICY_HEADER, b'{"delays": [1], "partition": "same"}')))
    assert same.partition == 3
    assert plan_for(request()).partition is None  # the key's partition, as before
    assert "partition must be 'same'" in reason(
        request((retries.POLICY_HEADER, b'{"partition": 3}'))
    )
    got = retrying.resolved(
        parsed(request((retries.POLICY_HEADER, b'{"partition": "same"}'))),
        policy.open_policy(3600, 1_000_000).default, AT, LIMITS,
    )  # fmt: skip
    assert got.partition == 3


def test_a_retry_keeps_the_failed_records_trace_context() -> None:
    """The retry continues the failed record's trace: its traceparent goes with the
    schedule (intake/traces.py carries it; with spans on, the fire span is its child)."""
    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    got = parsed(request(("traceparent", parent)))
    assert ("traceparent", parent) in got.headers

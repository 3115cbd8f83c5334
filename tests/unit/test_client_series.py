"""Series from the Python client and `blackbox send`: what they send is the rule the intake
parser reads (guarantee 8), pause and resume are requests of their own, and a signature
covers every field of a series (guarantee 7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from blackbox import client, envelope
from blackbox.cli import main as cli
from blackbox.cli import sending
from blackbox.client import Repeat
from blackbox.envelope import CALLER_HEADER, Envelope, Hold, Limits
from blackbox.errors import InvalidEnvelope
from blackbox.recurrence import Missed, Recurrence
from blackbox.signing import SIGNATURE_HEADER, Parts, Signer, parse_header, verify

LIMITS = Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset())
NEW_YEAR_2030 = datetime(2030, 1, 1, tzinfo=UTC)
NEW_YEAR_2030_MS = 1_893_456_000_000


class Recorder(Producer):
    """A producer that keeps what it is given (topic, value, key, headers)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]] = []

    def produce(self, topic: str, *args: Any, **options: Any) -> None:
        value, key = args
        self.sent.append((topic, value, key, options["headers"]))

    def poll(self, _timeout: float = 0) -> int:
        return 0


def parsed(document: dict[str, Any]) -> envelope.Request:
    return envelope.parse(orjson.dumps(document), [(CALLER_HEADER, b"billing")], LIMITS)


def test_a_repeat_is_the_rule_the_intake_reads() -> None:
    """Guarantee 8: every field of Repeat arrives in the parsed rule, seconds and datetimes
    converted as the intake reads them."""
    repeat = Repeat(cron="0 9 * * 1-5", timezone="Europe/Berlin", start=NEW_YEAR_2030,
                    end=NEW_YEAR_2030_MS / 1000 + 86_400, limit=10,
                    jitter=timedelta(milliseconds=1500), missed=Missed.ALL, grace=30)  # fmt: skip
    sent = client.envelope("reports", "run", schedule_id="daily", repeat=repeat)
    request = parsed(sent)
    assert isinstance(request, Envelope)
    assert (request.countdown_ms, request.at_ms, request.schedule_id) == (None, None, "daily")
    assert request.recurrence == Recurrence(
        timezone="Europe/Berlin", cron="0 9 * * 1-5", start_ms=NEW_YEAR_2030_MS,
        end_ms=NEW_YEAR_2030_MS + 86_400_000, limit=10, jitter_ms=1500, missed=Missed.ALL,
        grace_ms=30_000,
    )  # fmt: skip


def test_every_takes_seconds_or_a_timedelta_and_sends_only_what_is_given() -> None:
    """`every` may be a timedelta; fields left out are not sent (the intake's defaults)."""
    sent = client.envelope("t", 1, schedule_id="tick", repeat=Repeat(every=timedelta(minutes=20)))
    assert sent == {"topic": "t", "message": 1, "every": 1200.0, "id": "tick"}
    request = parsed(sent)
    assert isinstance(request, Envelope) and request.recurrence is not None
    assert request.recurrence.every_ms == 1_200_000


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"repeat": Repeat(every=60)}, "has an id"),
        ({"repeat": Repeat(every=60), "schedule_id": "x", "delay": 5}, "neither delay nor at"),
        ({"repeat": Repeat(), "schedule_id": "x"}, "exactly one of cron and every"),
        ({"repeat": Repeat(cron="* * * * *", every=1), "schedule_id": "x"}, "exactly one"),
        ({"repeat": Repeat(every=60, start=datetime(2030, 1, 1)), "schedule_id": "x"}, "start"),
        ({"repeat": Repeat(every=-1), "schedule_id": "x"}, "every must be >= 0"),
    ],
    ids=["no id", "and a delay", "no rule", "two rules", "naive start", "negative every"],
)
def test_a_series_the_client_cannot_send_is_refused_before_sending(
    options: dict[str, Any], refusal: str
) -> None:
    """What no intake could read the same way is a ValueError in the caller's hands."""
    with pytest.raises(ValueError, match=refusal):
        client.envelope("t", 1, **options)


def test_pause_and_resume_are_hold_requests_keyed_by_the_id() -> None:
    """pause() and resume() send the intake's hold requests, keyed by the id so they are
    applied after the series' own records."""
    recorder = Recorder()
    sender = client.Client(recorder, caller="billing", intake_topic="intake")
    sender.pause("daily")
    sender.resume("daily")
    requests = [parsed(orjson.loads(value)) for _, value, _, _ in recorder.sent]
    assert requests == [Hold("daily", b"billing", paused=True),
                        Hold("daily", b"billing", paused=False)]  # fmt: skip
    assert {key for _, _, key, _ in recorder.sent} == {b"daily"}


def test_a_signature_covers_the_series_fields_and_the_hold_requests() -> None:
    """Guarantee 7: a signed series verifies, and no field of its rule can be changed under
    the signature; a signed pause verifies too."""
    key = Ed25519PrivateKey.generate()
    recorder = Recorder()
    sender = client.Client(recorder, caller="billing", intake_topic="intake",
                           signer=Signer(key, "billing-1"))  # fmt: skip
    daily = Repeat(cron="0 9 * * *", timezone="Europe/Berlin", limit=3)
    sender.send_later("reports", "run", id="daily", repeat=daily)
    sender.pause("daily")
    for topic, value, record_key, headers in recorder.sent:
        signature = parse_header(dict(headers)[SIGNATURE_HEADER])
        verify(key.public_key(), signature, Parts(topic, record_key, value, headers))
    topic, value, record_key, headers = recorder.sent[0]
    signature = parse_header(dict(headers)[SIGNATURE_HEADER])
    for field, changed in (("cron", "* * * * *"), ("timezone", "UTC"), ("limit", 300)):
        forged = orjson.dumps({**orjson.loads(value), field: changed})
        with pytest.raises(InvalidEnvelope, match="does not match"):
            verify(key.public_key(), signature, Parts(topic, record_key, forged, headers))


def _send_args(*options: str) -> Any:
    return cli._parser().parse_args(["send", "--topic", "t", *options, '"x"'])


def test_send_reads_every_series_option() -> None:
    """`blackbox send --cron ... --id ...` builds the Repeat of every series option."""
    args = _send_args("--cron", "0 9 * * 1-5", "--timezone", "Europe/Berlin", "--id", "daily",
                      "--start", "2030-01-01T00:00:00+00:00", "--end", "1893542400", "--limit",
                      "3", "--jitter", "1.5", "--missed", "skip", "--grace", "30")  # fmt: skip
    assert sending._when(args) == {"repeat": Repeat(
        cron="0 9 * * 1-5", timezone="Europe/Berlin", start=NEW_YEAR_2030, end=1893542400.0,
        limit=3, jitter=1.5, missed="skip", grace=30.0)}  # fmt: skip
    every = sending._when(_send_args("--every", "60", "--id", "tick"))
    assert every == {"repeat": Repeat(every=60.0)}


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (("--every", "60"), "needs --id"),
        (("--countdown", "5", "--timezone", "UTC"), "--timezone: only for a series"),
        (("--id", "x"), "give --countdown, --at, --cron or --every"),
    ],
    ids=["series without id", "series option on a one-off", "no time at all"],
)
def test_send_refuses_series_options_it_cannot_use(options: tuple[str, ...], refusal: str) -> None:
    """A series without --id, or a series option without --cron/--every, is a usage error."""
    with pytest.raises(ValueError, match=refusal):
        sending._when(_send_args(*options))


def test_send_takes_one_way_of_timing() -> None:
    """--countdown, --at, --cron and --every exclude each other (argparse says so)."""
    with pytest.raises(SystemExit):
        _send_args("--countdown", "5", "--every", "60", "--id", "x")


def test_pause_and_resume_are_commands_like_cancel() -> None:
    """`blackbox pause ID` and `resume ID` take the options of `cancel`."""
    for verb, command in (("pause", sending.cmd_pause), ("resume", sending.cmd_resume)):
        args = cli._parser().parse_args([verb, "daily", "--caller", "billing", "--wait", "5"])
        assert (args.command, args.id, args.caller, args.wait) == (command, "daily", "billing", 5)

"""`blackbox send`, `cancel`, `pause` and `resume`: a caller's requests sent through the
intake topic as its own producer would, each answer waited for on the events topic and
turned into an exit code (`exit_for`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import structlog
from confluent_kafka import KafkaException

from blackbox import client, envelope, tracecontext
from blackbox.cli import keypair
from blackbox.cli.progress import Progress
from blackbox.envelope import CALLER_HEADER
from blackbox.errors import InvalidEnvelope
from blackbox.exits import EXIT_FAILED, EXIT_OK, EXIT_UNCHANGED, EXIT_USAGE
from blackbox.intake.runner import limits_of
from blackbox.kafka.answers import Answers
from blackbox.kafka.events import Outcome
from blackbox.recurrence import Missed
from blackbox.settings import Settings

CANCEL_ANSWERS = frozenset(
    o.value
    for o in (Outcome.CANCELLED, Outcome.ALREADY_FIRED, Outcome.NOT_FOUND, Outcome.DEAD_LETTERED)
)

SEND_ANSWERS = frozenset(
    o.value for o in (Outcome.SCHEDULED, Outcome.UPDATED, Outcome.DEAD_LETTERED)
)
HOLD_ANSWERS = frozenset(
    o.value
    for o in (Outcome.PAUSED, Outcome.RESUMED, Outcome.NOT_RECURRING, Outcome.CANCELLED,
              Outcome.ALREADY_FIRED, Outcome.NOT_FOUND, Outcome.DEAD_LETTERED)
)  # fmt: skip
# The answers that mean a request did what it asked; any other but dead_lettered changed
# nothing (exit EXIT_UNCHANGED: a script learns that nothing was cancelled, paused...).
SENT = frozenset({Outcome.SCHEDULED.value, Outcome.UPDATED.value})
CANCELLED = frozenset({Outcome.CANCELLED.value})
PAUSED = frozenset({Outcome.PAUSED.value})
RESUMED = frozenset({Outcome.RESUMED.value})
log = structlog.get_logger("blackbox.cli.sending")


def add_by_id(
    commands: Any, name: str, summary: str, command: Callable[[argparse.Namespace, Settings], int]
) -> None:
    """A command about one of the caller's ids, sent through the intake topic."""
    parser = commands.add_parser(name, help=summary)
    parser.add_argument("id", metavar="ID", help="the id it was scheduled with")
    parser.add_argument("--caller", help=f"the {CALLER_HEADER} it was scheduled as")
    keypair.add_signing_options(parser)
    parser.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the answer on the events topic (0: don't); exit 3 when "
        "it changed nothing (not_found, already_fired, not_recurring, cancelled)",
    )
    parser.set_defaults(command=command)


def add_send(commands: Any) -> None:
    send = commands.add_parser(
        "send", help="schedule a message, or a file of them, through the intake topic",
        description="Schedule MESSAGE for --topic, or every envelope of --file (JSON lines).",
    )  # fmt: skip
    send.add_argument("--topic", help="the topic to deliver to")
    when = send.add_mutually_exclusive_group()
    when.add_argument("--countdown", type=float, help="seconds from now")
    when.add_argument("--at", help="when: RFC 3339 with an offset, or epoch seconds")
    when.add_argument("--cron", help="a series: at each time of this cron rule (needs --id)")
    when.add_argument("--every", type=float, metavar="SECONDS",
                      help="a series: every so many seconds (needs --id)")  # fmt: skip
    _add_series_options(send)
    send.add_argument("--id", help="your id for it, to update or cancel it later")
    send.add_argument("--key", help="the key of the delivered record")
    send.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                      help="a header of the delivered record (repeatable)")  # fmt: skip
    send.add_argument("--caller", help=f"the {CALLER_HEADER} header")
    keypair.add_signing_options(send)
    kind = send.add_mutually_exclusive_group()
    kind.add_argument("--text", action="store_true", help="MESSAGE is a string, not JSON")
    kind.add_argument("--binary", action="store_true",
                      help="MESSAGE names a file whose bytes are the message")  # fmt: skip
    send.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                      help="wait this long for the answer on the events topic (needs --id); "
                      "exit 1 if dead-lettered")  # fmt: skip
    send.add_argument("--file", help="send each line of this file (one JSON envelope per "
                      "line; - reads standard input)")  # fmt: skip
    send.add_argument("message", metavar="MESSAGE", nargs="?",
                      help="the message, as JSON (or text with --text)")  # fmt: skip
    send.set_defaults(command=cmd_send)


def _add_series_options(send: Any) -> None:
    series = send.add_argument_group("series (with --cron or --every)")
    series.add_argument("--timezone", help="the IANA zone a cron rule is read in (UTC)")
    series.add_argument("--start", help="no occurrence before: RFC 3339 or epoch seconds")
    series.add_argument("--end", help="no occurrence after: RFC 3339 or epoch seconds")
    series.add_argument("--limit", type=_run_count,
                        help="how many occurrences to deliver at most")  # fmt: skip
    series.add_argument("--jitter", type=float, metavar="SECONDS",
                        help="delay each occurrence by up to this much")  # fmt: skip
    series.add_argument("--missed", choices=[m.value for m in Missed],
                        help="occurrences missed while nothing could fire: none, the latest "
                        "(once, the default) or each within a day")  # fmt: skip
    series.add_argument("--grace", type=float, metavar="SECONDS",
                        help="how late an occurrence may be before it is missed (60)")  # fmt: skip


SERIES_OPTIONS = ("timezone", "start", "end", "limit", "jitter", "missed", "grace")


def _run_count(text: str) -> int:
    """A series' `--limit`: a whole number a JSON envelope can carry (64 bits)."""
    count = int(text)
    if not 1 <= count < 2**63:
        raise argparse.ArgumentTypeError(f"--limit must be 1 to 2**63-1, not {text}")
    return count


def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    if args.file is not None:
        return _send_file(args, settings)
    try:
        message = _message(args)
        when = _when(args)
        headers = dict(_header(h) for h in args.header)
        document = client.envelope(
            args.topic or _usage("--topic is required"), message, **when,
            key=args.key, headers=headers, schedule_id=args.id,
        )  # fmt: skip
        encoded = orjson.dumps(document)
    except orjson.JSONEncodeError as e:  # a number JSON cannot carry (beyond 64 bits)
        error(f"not sendable as JSON: {e}")
        return EXIT_USAGE
    except (ValueError, OSError) as e:
        error(str(e))
        return EXIT_USAGE
    if args.wait > 0 and args.id is None:
        error("--wait needs --id (the answer is matched by it)")
        return EXIT_USAGE

    def request(sender: client.Client) -> None:
        sender.send_raw(encoded, args.id)

    return _answered(args, settings, request, SEND_ANSWERS, SENT, topic=args.topic, id=args.id)


def _client(args: argparse.Namespace, settings: Settings) -> client.Client:
    return client.Client(dict(settings.kafka), caller=args.caller,
                         intake_topic=settings.intake_topic, signer=keypair.signer_of(args),
                         context=partial(tracecontext.from_environment, os.environ))  # fmt: skip


def _answered(
    args: argparse.Namespace, settings: Settings, request: Callable[[client.Client], None],
    expected: frozenset[str], done: frozenset[str], **context: object,
) -> int:  # fmt: skip
    """Send one request; with --wait, print blackbox's answer (one of `expected`) and exit
    by it (exit_for: 0 when it is one of `done`)."""
    answers = Answers(settings.kafka, settings.events_topic) if args.wait > 0 else None
    try:
        if answers is not None:
            answers.mark()
        sender = _client(args, settings)
        request(sender)
        code = _flushed(sender, **context)
        if code != EXIT_OK or answers is None:
            return code
        answer = answers.wait(args.caller, args.id, args.wait, expected)
    except KafkaException as e:
        error(str(e))
        return EXIT_FAILED
    finally:
        if answers is not None:
            answers.close()
    return _printed(answer, settings.events_topic, args.wait, done)


def _printed(
    answer: dict[str, Any] | None, events_topic: str, waited: float, done: frozenset[str]
) -> int:
    if answer is None:
        error(f"no answer on {events_topic} within {waited} s")
        return EXIT_FAILED
    print(answer["outcome"])  # noqa: T201 - the command's output
    if answer["outcome"] == Outcome.DEAD_LETTERED.value:
        error(f"dead-lettered: {answer['reason']}: {answer['detail']}")
    elif answer["outcome"] not in done:
        error(f"{answer['outcome']}: nothing was changed")
    return exit_for(answer["outcome"], done)


def exit_for(outcome: str, done: frozenset[str]) -> int:
    """0 when the answer is what the request asked for; 1 when it was dead-lettered; else
    EXIT_UNCHANGED: blackbox read the request and changed nothing (an unknown id, one that
    fired already, a pause of a one-off schedule or of a cancelled series)."""
    if outcome in done:
        return EXIT_OK
    if outcome == Outcome.DEAD_LETTERED.value:
        return EXIT_FAILED
    return EXIT_UNCHANGED


def _message(args: argparse.Namespace) -> object:
    if args.message is None:
        raise ValueError("MESSAGE is required (or --file)")
    if args.binary:
        return Path(args.message).read_bytes()
    if args.text:
        return args.message
    try:
        return orjson.loads(args.message)
    except orjson.JSONDecodeError as e:
        raise ValueError("MESSAGE is not JSON; add --text to send it as a string") from e


def _when(args: argparse.Namespace) -> dict[str, Any]:
    given = [f"--{name}" for name in SERIES_OPTIONS if getattr(args, name) is not None]
    if args.cron is not None or args.every is not None:
        return {"repeat": _repeat(args)}
    if given:
        raise ValueError(f"{', '.join(given)}: only for a series (--cron or --every)")
    if args.countdown is not None:
        return {"delay": args.countdown}
    if args.at is None:
        raise ValueError("give --countdown, --at, --cron or --every")
    return {"at": _moment(args.at)}


def _repeat(args: argparse.Namespace) -> client.Repeat:
    if args.id is None:
        raise ValueError("a series needs --id (to pause, resume or cancel it)")
    return client.Repeat(
        cron=args.cron, every=args.every, timezone=args.timezone,
        start=None if args.start is None else _moment(args.start),
        end=None if args.end is None else _moment(args.end), limit=args.limit,
        jitter=args.jitter, missed=args.missed, grace=args.grace,
    )  # fmt: skip


def _moment(text: str) -> datetime | float:
    """Epoch seconds, or an ISO time (a naive one is refused by the client)."""
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text)


def _header(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise ValueError(f"--header {text!r} is not NAME=VALUE")
    return name, value


def _usage(text: str) -> str:
    raise ValueError(text)


def _send_file(args: argparse.Namespace, settings: Settings) -> int:
    """Check every line first (nothing is sent if one is bad), then send them all."""
    try:
        lines = _read_lines(args.file)
    except OSError as e:
        error(str(e))
        return EXIT_USAGE
    limits = limits_of(settings)
    headers = [(CALLER_HEADER, args.caller.encode())] if args.caller else []
    problems, ids = [], []
    for number, line in lines:
        try:
            ids.append(envelope.parse(line, headers, limits).schedule_id)
        except InvalidEnvelope as e:
            problems.append(f"line {number}: {e.reason.value}: {e.detail}")
    if problems:
        for problem in problems[:20]:
            error(problem)
        error(f"{len(problems)} of {len(lines)} lines are invalid; nothing was sent")
        return EXIT_USAGE
    sender = _client(args, settings)
    with Progress(len(lines), sys.stderr) as progress:
        for (_, line), schedule_id in zip(lines, ids, strict=True):
            sender.send_raw(line, schedule_id)
            progress.show(sender.acknowledged)
        while sender.producer.flush(0.2):
            progress.show(sender.acknowledged)
        progress.show(sender.acknowledged)
    return _flushed(sender, file=args.file, lines=len(lines))


def _read_lines(path: str) -> list[tuple[int, bytes]]:
    raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    numbered = enumerate(raw.splitlines(), start=1)
    return [(n, line.strip()) for n, line in numbered if line.strip()]


def _flushed(sender: client.Client, **context: object) -> int:
    try:
        sender.flush(30.0)
    except client.SendFailed as e:
        log.error("send_failed", error=str(e), **context)
        return EXIT_FAILED
    log.info("sent", count=sender.acknowledged, **context)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel, then print blackbox's answer (cancelled, already_fired or not_found)."""

    def request(sender: client.Client) -> None:
        sender.cancel(args.id)

    return _answered(args, settings, request, CANCEL_ANSWERS, CANCELLED, id=args.id)


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    """Pause a series, then print blackbox's answer (paused, not_recurring, not_found...)."""

    def request(sender: client.Client) -> None:
        sender.pause(args.id)

    return _answered(args, settings, request, HOLD_ANSWERS, PAUSED, id=args.id)


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume a series, then print blackbox's answer (resumed, not_recurring, not_found...)."""

    def request(sender: client.Client) -> None:
        sender.resume(args.id)

    return _answered(args, settings, request, HOLD_ANSWERS, RESUMED, id=args.id)


def error(text: str) -> None:
    """Tell the user's terminal what went wrong."""
    print(f"blackbox: {text}", file=sys.stderr)  # noqa: T201 - the user's terminal

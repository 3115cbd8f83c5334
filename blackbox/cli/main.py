"""The `blackbox` command.

Exit codes: 0 success; 1 the service, a send or a Spark job failed at run time (or no
answer came, or the request was dead-lettered); 2 bad usage or settings, a Redis that may
evict keys (its maxmemory-policy is not noeviction), or `blackbox spark ...` without PySpark
installed; 3 done, with something to act on: `cancel`, `pause` or `resume` answered but
changed nothing (not_found, already_fired, not_recurring, cancelled), or `blackbox spark
audit` found messages lost, or late beyond --max-late.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import structlog
from confluent_kafka import KafkaException

from blackbox import client, envelope, logs, tracecontext
from blackbox.backoff import Backoff
from blackbox.cli import api_commands, keypair
from blackbox.cli.progress import Progress
from blackbox.dev.stack import BROKERS, DEV_PARTITIONS, DevOptions, DevStack
from blackbox.envelope import CALLER_HEADER
from blackbox.errors import (
    InvalidEnvelope,
    RedisUnreachable,
    SettingsError,
    SparkMissing,
    StackError,
)
from blackbox.exits import EXIT_FAILED, EXIT_OK, EXIT_UNCHANGED, EXIT_USAGE
from blackbox.intake import rebuild
from blackbox.intake.runner import caller_policy_of, limits_of
from blackbox.kafka import clients, readback, retention
from blackbox.kafka.answers import Answers
from blackbox.kafka.events import Outcome
from blackbox.recurrence import Missed
from blackbox.role import Role
from blackbox.service import Service
from blackbox.settings import Settings, describe, service_links
from blackbox.spark import command as spark_command
from blackbox.version import version

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
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
REBUILD_DESCRIPTION = """\
Write every schedule still pending back to Redis from what Kafka holds, after Redis lost
its data (flushed, restarted empty, restored from an old snapshot). Every replica must be
stopped. The namespace's keys are deleted; each intake partition is read from its start to
the group's committed offset through the intake's own rules; a version the target topics
show delivered (or dead-lettered, or aged out of its target topic) is not written back,
and a series goes on after its latest delivered occurrence. Nothing is answered or
dead-lettered again. It refuses, deleting nothing, when the intake topic no longer holds
its first records, unless given --accept-aged-out. While it runs (or if it stops
half-way) a service started keeps its intake stopped. Start the service afterwards: it
goes on from the committed offsets.
"""
log = structlog.get_logger("blackbox.cli.main")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as e:
        _error(str(e))
        return EXIT_USAGE
    logs.configure(settings.log_format, settings.log_level)
    if links := service_links(os.environ):
        log.info("service_links_ignored", variables=sorted(links))
    try:
        code: int = args.command(args, settings)
    except (SettingsError, StackError, SparkMissing) as e:
        _error(str(e))
        return EXIT_USAGE
    return code


def _error(text: str) -> None:
    print(f"blackbox: {text}", file=sys.stderr)  # noqa: T201 - the user's terminal


DEV_DESCRIPTION = """\
Start Redis and Apache Kafka (or Tansu) on loopback, then run the service against them.

Every API call is open without a token (BLACKBOX_API_DEV_OPEN=true), so the API is served on
127.0.0.1 only and answers only the Host names localhost, 127.0.0.1 and [::1]. To reach it
from elsewhere: BLACKBOX_HTTP_HOST=0.0.0.0 and BLACKBOX_API_ALLOWED_HOSTS=<names>, and
better a BLACKBOX_API_TOKEN (with one set, every call needs it)."""


def _parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="blackbox", description=__doc__, formatter_class=raw)
    parser.add_argument("--version", action="version", version=f"blackbox {version()}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    epilog = "settings (environment variables):\n" + describe()
    run = commands.add_parser("run", help="run the service", epilog=epilog, formatter_class=raw)
    run.add_argument("--role", choices=[r.value for r in Role], default=Role.ALL.value,
                     help="intake: consume the intake topic into Redis, never fire; dispatch: "
                     "fire what is due, never consume; all: both (default)")  # fmt: skip
    run.set_defaults(command=cmd_run)
    dev = commands.add_parser("dev", help="start a local Redis and broker, then run the service",
                              description=DEV_DESCRIPTION, epilog=epilog,
                              formatter_class=raw)  # fmt: skip
    dev.add_argument("--broker", choices=BROKERS, default="kafka",
                     help="Apache Kafka, or the light Tansu broker (keeps nothing)")  # fmt: skip
    dev.add_argument("--redis-port", type=int, default=6379, help="the local Redis's port")
    dev.add_argument("--kafka-port", type=int, default=9092,
                     help="the broker's port; Kafka's controller takes the next one")  # fmt: skip
    dev.add_argument("--state-dir", type=Path, default=None,
                     help="Kafka's and Redis's data (~/.local/state/blackbox/dev)")  # fmt: skip
    dev.add_argument("--fresh", action="store_true", help="delete the kept state and start empty")
    dev.set_defaults(command=cmd_dev)
    topics = commands.add_parser(
        "create-topics", help="create the intake, dead-letter and events topics"
    )
    topics.add_argument("--partitions", type=int, default=1,
                        help="partitions of each topic it creates")  # fmt: skip
    topics.set_defaults(command=cmd_create_topics)
    rebuilding = commands.add_parser(
        "rebuild", help="write every pending schedule back to Redis from Kafka",
        description=REBUILD_DESCRIPTION, formatter_class=raw,
    )  # fmt: skip
    rebuilding.add_argument("--yes", action="store_true",
                            help="delete the namespace's keys and rebuild them")  # fmt: skip
    rebuilding.add_argument(rebuild.ACCEPT_FLAG, action="store_true", dest="accept_aged_out",
                            help="rebuild although the intake topic's retention removed its "
                                 "first records (what they created is lost)")  # fmt: skip
    rebuilding.set_defaults(command=cmd_rebuild)
    _add_send(commands)
    _add_by_id(commands, "cancel", "cancel a pending schedule (or series) by its id", cmd_cancel)
    _add_by_id(commands, "pause", "hold a series by its id: its occurrences are passed over",
               cmd_pause)  # fmt: skip
    _add_by_id(commands, "resume", "release a paused series by its id", cmd_resume)
    api_commands.add_commands(commands)
    keypair.add_commands(commands)
    spark_command.add_commands(commands)
    return parser


def _add_by_id(
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


def _add_send(commands: Any) -> None:
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


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    backoff = Backoff(base=1.0, cap=30.0)
    while True:  # a Redis Cluster must answer before the service can be built
        try:
            service = Service(settings, role=Role(args.role), environ=os.environ)
        except RedisUnreachable as e:
            delay = backoff.next()
            log.warning("redis_unreachable", error=str(e), retry_in_s=delay)
            time.sleep(delay)
            continue
        return service.run_until_signalled()


def cmd_create_topics(args: argparse.Namespace, settings: Settings) -> int:
    policy = caller_policy_of(settings)
    names = [*settings.own_topics, *sorted(policy.bound_topics)]
    clients.ensure_topics(settings.kafka, names, partitions=args.partitions)
    intake = [settings.intake_topic, *sorted(policy.bound_topics)]
    needed = retention.needed_ms(policy.longest_horizon_seconds, settings.grace_seconds)
    # The dead-letter topic too: a rebuild reads there what was refused and what failed.
    raised = retention.raise_to(settings.kafka, [*intake, settings.dlq_topic], needed)
    for topic, before in raised.items():
        event = "dead_letter_retention_raised" if topic == settings.dlq_topic else None
        log.info(event or "intake_retention_raised", topic=topic, before_ms=before,
                 retention_ms=needed)  # fmt: skip
    log.info("topics_ready", topics=names, intake_retention_ms=needed)
    return EXIT_OK


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    if not args.yes:
        _error(f"rebuild deletes every key of namespace {settings.namespace!r} and writes back "
               "what Kafka holds: stop every replica, then run it with --yes")  # fmt: skip
        return EXIT_USAGE
    try:
        counts = rebuild.rebuild(settings, accept_aged_out=args.accept_aged_out)
    except (rebuild.ReplicasRunning, rebuild.AgedOut, readback.Unreadable) as e:
        _error(str(e))
        return EXIT_USAGE
    done = log.warning if counts.refused else log.info  # refused now: lost, say so loudly
    done("rebuild_done", records=counts.records, written=counts.written,
             passed_over=dict(counts.passed_over), refused=counts.refused,
             refused_before=counts.refused_before, skipped=counts.skipped,
             aged_out_records=counts.aged_out_records, targets=sorted(counts.targets))  # fmt: skip
    return EXIT_OK


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
        _error(f"not sendable as JSON: {e}")
        return EXIT_USAGE
    except (ValueError, OSError) as e:
        _error(str(e))
        return EXIT_USAGE
    if args.wait > 0 and args.id is None:
        _error("--wait needs --id (the answer is matched by it)")
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
        _error(str(e))
        return EXIT_FAILED
    finally:
        if answers is not None:
            answers.close()
    return _printed(answer, settings.events_topic, args.wait, done)


def _printed(
    answer: dict[str, Any] | None, events_topic: str, waited: float, done: frozenset[str]
) -> int:
    if answer is None:
        _error(f"no answer on {events_topic} within {waited} s")
        return EXIT_FAILED
    print(answer["outcome"])  # noqa: T201 - the command's output
    if answer["outcome"] == Outcome.DEAD_LETTERED.value:
        _error(f"dead-lettered: {answer['reason']}: {answer['detail']}")
    elif answer["outcome"] not in done:
        _error(f"{answer['outcome']}: nothing was changed")
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
        _error(str(e))
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
            _error(problem)
        _error(f"{len(problems)} of {len(lines)} lines are invalid; nothing was sent")
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


def _url_host(host: str) -> str:
    """The host as a URL names it: an IPv6 address in brackets, any-address as loopback."""
    if host in ("0.0.0.0", "", "::"):  # noqa: S104 - only read, to name a reachable address
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def cmd_dev(args: argparse.Namespace, _settings: Settings) -> int:
    """The local stack: Redis and Apache Kafka (or Tansu) started here, then the service."""
    options = DevOptions(args.broker, args.redis_port, args.kafka_port, args.state_dir,
                         args.fresh)  # fmt: skip
    stack = DevStack(options)
    stack.start()
    try:
        local = Settings.from_env(stack.environment())
        if local.http_host not in LOOPBACK_HOSTS:
            log.warning("dev_api_reachable_from_the_network", http_host=local.http_host,
                        allowed_hosts=local.api_allowed_hosts)  # fmt: skip
        clients.ensure_topics(local.kafka, local.own_topics, partitions=DEV_PARTITIONS)
        service = Service(local, environ=os.environ)
        ready = {"redis": local.redis_url, "kafka": local.kafka["bootstrap.servers"],
                 "broker": args.broker, "state": str(stack.state)}  # fmt: skip
        if service.endpoints is not None:  # bound already: its port is known
            site = f"http://{_url_host(local.http_host)}:{service.endpoints.port}"
            ready |= {"admin_page": f"{site}/", "api": f"{site}/api/v1"}
        log.info("local_stack_ready", **ready)
        return service.run_until_signalled()
    finally:
        stack.stop()

"""The `blackbox` command.

Exit codes: 0 success; 1 the service or a send failed at run time; 2 bad usage or settings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import orjson
import structlog
from confluent_kafka import Producer

from blackbox import kafka, logs
from blackbox.envelope import CALLER_HEADER
from blackbox.errors import SettingsError
from blackbox.localstack import RedisServer, StackError, TansuBroker, port_open, scratch_dir
from blackbox.outbox import Outbox, Record
from blackbox.service import Service
from blackbox.settings import Settings, describe

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
log = structlog.get_logger("blackbox.cli")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as e:
        _error(str(e))
        return EXIT_USAGE
    logs.configure(settings.log_format, settings.log_level)
    try:
        code: int = args.command(args, settings)
    except (SettingsError, StackError) as e:
        _error(str(e))
        return EXIT_USAGE
    return code


def _error(text: str) -> None:
    print(f"blackbox: {text}", file=sys.stderr)  # noqa: T201 - the user's terminal


def _parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="blackbox", description=__doc__, formatter_class=raw)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    epilog = "settings (environment variables):\n" + describe()
    run = commands.add_parser("run", help="run the service", epilog=epilog, formatter_class=raw)
    run.set_defaults(command=cmd_run)
    dev = commands.add_parser("dev", help="start a local Redis and broker, then run the service",
                              epilog=epilog, formatter_class=raw)  # fmt: skip
    dev.add_argument("--redis-port", type=int, default=6379)
    dev.add_argument("--kafka-port", type=int, default=9092)
    dev.set_defaults(command=cmd_dev)
    topics = commands.add_parser("create-topics", help="create the intake and dead-letter topics")
    topics.add_argument("--partitions", type=int, default=1)
    topics.set_defaults(command=cmd_create_topics)
    send = commands.add_parser("send", help="schedule one message through the intake topic")
    send.add_argument("--topic", required=True, help="the topic to deliver to")
    send.add_argument("--countdown", required=True, type=float, help="seconds from now")
    send.add_argument("--caller", help=f"the {CALLER_HEADER} header")
    send.add_argument("--text", action="store_true", help="send MESSAGE as a string, not JSON")
    send.add_argument(
        "message", metavar="MESSAGE", help="the message, as JSON (or text with --text)"
    )
    send.set_defaults(command=cmd_send)
    return parser


def cmd_run(_args: argparse.Namespace, settings: Settings) -> int:
    return Service(settings).run_until_signalled()


def cmd_create_topics(args: argparse.Namespace, settings: Settings) -> int:
    names = [settings.intake_topic, settings.dlq_topic]
    kafka.ensure_topics(settings.kafka, names, partitions=args.partitions)
    log.info("topics_ready", topics=names)
    return EXIT_OK


def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    if args.text:
        message: object = args.message
    else:
        try:
            message = orjson.loads(args.message)
        except orjson.JSONDecodeError:
            _error("MESSAGE is not JSON; add --text to send it as a string")
            return EXIT_USAGE
    value = orjson.dumps({"topic": args.topic, "message": message, "countdown": args.countdown})
    headers = [(CALLER_HEADER, args.caller.encode())] if args.caller else []
    outbox = Outbox(Producer(dict(settings.kafka)), wait_seconds=15)
    (error,) = outbox.send([Record(settings.intake_topic, value, None, headers)])
    if error is not None:
        log.error("send_failed", error=error.str())
        return EXIT_FAILED
    log.info(
        "message_sent",
        intake_topic=settings.intake_topic,
        topic=args.topic,
        countdown=args.countdown,
    )
    return EXIT_OK


def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    """The embedded local stack: reuse what already listens on a port, start the rest."""
    data = scratch_dir("blackbox-dev-")
    started = _start_unless_listening(
        [RedisServer(args.redis_port, data), TansuBroker(args.kafka_port, data / "tansu.log")]
    )
    try:
        local = _local_settings(settings, args.redis_port, args.kafka_port)
        kafka.ensure_topics(local.kafka, [local.intake_topic, local.dlq_topic])
        log.info("local_stack_ready", redis=local.redis_url, kafka=local.kafka["bootstrap.servers"],
                 logs=str(data))  # fmt: skip
        return Service(local).run_until_signalled()
    finally:
        for server in reversed(started):
            server.stop()


def _start_unless_listening(
    servers: list[RedisServer | TansuBroker],
) -> list[RedisServer | TansuBroker]:
    started = []
    for server in servers:
        if port_open(server.port):
            log.info("local_server_reused", server=type(server).__name__, port=server.port)
            continue
        server.start()
        started.append(server)
    return started


def _local_settings(settings: Settings, redis_port: int, kafka_port: int) -> Settings:
    environ: Mapping[str, str] = {
        # Tansu hands out partitions after session.timeout.ms / 2: keep the wait short.
        "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000",
        **os.environ,
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
    }
    return Settings.from_env(environ)

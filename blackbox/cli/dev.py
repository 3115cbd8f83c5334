"""`blackbox dev`: the local stack (dev/stack.py) with its topics prepared as
`create-topics` prepares them, then the service run against it, or, with --no-service,
nothing more: the connection settings are printed and the stack waits for Ctrl-C."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
from pathlib import Path

import structlog

from blackbox.cli import topics
from blackbox.dev.stack import BROKERS, DEV_PARTITIONS, DevOptions, DevStack
from blackbox.exits import EXIT_OK
from blackbox.service import Service
from blackbox.settings import Settings

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
DESCRIPTION = """\
Start Redis and Apache Kafka (or Tansu) on loopback, create blackbox's topics, then run the
service against them (or, with --no-service, print the settings that reach them and wait).

Every API call is open without a token (BLACKBOX_API_DEV_OPEN=true), so the API is served on
127.0.0.1 only and answers only the Host names localhost, 127.0.0.1 and [::1]. To reach it
from elsewhere: BLACKBOX_HTTP_HOST=0.0.0.0 and BLACKBOX_API_ALLOWED_HOSTS=<names>, and
better a BLACKBOX_API_TOKEN (with one set, every call needs it)."""
# What --no-service prints: the settings a service (or a debugger's) needs to reach the stack.
CONNECTION_SETTINGS = ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS")
log = structlog.get_logger("blackbox.cli.dev")


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser], epilog: str) -> None:
    dev = commands.add_parser("dev", help="start a local Redis and broker, then run the service",
                              description=DESCRIPTION, epilog=epilog,
                              formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    dev.add_argument("--broker", choices=BROKERS, default="kafka",
                     help="Apache Kafka, or the light Tansu broker (keeps nothing)")  # fmt: skip
    dev.add_argument("--redis-port", type=int, default=6379, help="the local Redis's port")
    dev.add_argument("--kafka-port", type=int, default=9092,
                     help="the broker's port; Kafka's controller takes the next one")  # fmt: skip
    dev.add_argument("--state-dir", type=Path, default=None,
                     help="Kafka's and Redis's data (~/.local/state/blackbox/dev)")  # fmt: skip
    dev.add_argument("--fresh", action="store_true", help="delete the kept state and start empty")
    dev.add_argument("--no-service", action="store_true", dest="no_service",
                     help="start Redis and the broker and create the topics, but not the "
                     "service: print the settings that reach them and wait for Ctrl-C")  # fmt: skip
    dev.set_defaults(command=cmd_dev)


def url_host(host: str) -> str:
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
        environment = stack.environment()
        local = Settings.from_env(environment)
        topics.prepare(local, DEV_PARTITIONS)
        ready = {"redis": local.redis_url, "kafka": local.kafka["bootstrap.servers"],
                 "broker": args.broker, "state": str(stack.state)}  # fmt: skip
        if args.no_service:
            return _wait_without_service(environment, ready)
        return _run_service(local, ready)
    finally:
        stack.stop()


def _run_service(local: Settings, ready: dict[str, str]) -> int:
    if local.http_host not in LOOPBACK_HOSTS:
        log.warning("dev_api_reachable_from_the_network", http_host=local.http_host,
                    allowed_hosts=local.api_allowed_hosts)  # fmt: skip
    service = Service(local, environ=os.environ)
    if service.endpoints is not None:  # bound already: its port is known
        site = f"http://{url_host(local.http_host)}:{service.endpoints.port}"
        ready |= {"admin_page": f"{site}/", "api": f"{site}/api/v1"}
    log.info("local_stack_ready", service=True, **ready)
    return service.run_until_signalled()


def _wait_without_service(environment: dict[str, str], ready: dict[str, str]) -> int:
    """Print the connection settings as shell lines, then block until SIGINT or SIGTERM."""
    received: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, _frame: received.append(number))
    log.info("local_stack_ready", service=False, **ready)
    for name in CONNECTION_SETTINGS:
        print(f"export {name}={shlex.quote(environment[name])}", flush=True)  # noqa: T201
    while not received:
        signal.pause()  # returns once a handler has run
    log.info("signal_received", signal=signal.Signals(received[0]).name)
    return EXIT_OK

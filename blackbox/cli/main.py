"""The `blackbox` command.

Exit codes: 0 success; 1 the service, a send or a Spark job failed at run time (or no
answer came, or the request was dead-lettered); 2 bad usage or settings, a Redis that may
evict keys (its maxmemory-policy is not noeviction), a store topic missing or not compacted
alone, or `blackbox spark ...` without PySpark installed; 3 done, with something to act
on: `cancel`, `pause`, `resume` or `reschedule` answered but changed nothing (not_found,
already_fired, not_recurring, recurring, cancelled), `show` found no such schedule
(not_found), or `blackbox spark audit` found messages lost, or late beyond --max-late.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import structlog

from blackbox import logs
from blackbox.backoff import Backoff
from blackbox.cli import api_commands, dev, keypair, sending, topics
from blackbox.cli.sending import error
from blackbox.clock import now_ms
from blackbox.errors import (
    RedisUnreachable,
    SettingsError,
    SparkMissing,
    StackError,
)
from blackbox.exits import EXIT_OK, EXIT_USAGE
from blackbox.intake import filling, rebuild
from blackbox.kafka import readback, retention
from blackbox.role import Role
from blackbox.service import Service
from blackbox.settings import Settings, describe, service_links
from blackbox.spark import command as spark_command
from blackbox.storage import shardcount
from blackbox.storage.connections import redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from blackbox.version import version

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

With BLACKBOX_STORE_TOPIC set, it writes back what the store topic keeps instead, and
reads only the intake records past the committed offsets; it refuses a store never filled
(blackbox fill-store) and intake records lost past a committed offset.
"""
FILL_DESCRIPTION = """\
Write every schedule pending in the namespace to the store topic (BLACKBOX_STORE_TOPIC),
then a record and a Redis mark saying the store holds them all: the step that moves a
namespace with schedules to a store topic (docs/upgrading.md). Every replica must be
stopped (it refuses while a heartbeat is live); the store topic must exist compacted
(blackbox create-topics). Until it ran, a replica refuses to start on that store, and a
rebuild refuses to read it.
"""
log = structlog.get_logger("blackbox.cli.main")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as e:
        error(str(e))
        return EXIT_USAGE
    logs.configure(settings.log_format, settings.log_level)
    if links := service_links(os.environ):
        log.info("service_links_ignored", variables=sorted(links))
    try:
        code: int = args.command(args, settings)
    except (SettingsError, StackError, SparkMissing) as e:
        error(str(e))
        return EXIT_USAGE
    return code


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
    dev.add_command(commands, epilog)
    topics.add_command(commands)
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
    filling_store = commands.add_parser(
        "fill-store", help="write every pending schedule to the store topic, once, before "
        "the service keeps it (BLACKBOX_STORE_TOPIC set on a namespace with schedules)",
        description=FILL_DESCRIPTION, formatter_class=raw,
    )  # fmt: skip
    filling_store.add_argument("--yes", action="store_true",
                               help="every replica is stopped: write them")  # fmt: skip
    filling_store.set_defaults(command=cmd_fill_store)
    sending.add_send(commands)
    sending.add_by_id(commands, "cancel", "cancel a pending schedule (or series) by its id",
                      sending.cmd_cancel)  # fmt: skip
    sending.add_by_id(commands, "pause", "hold a series by its id: its occurrences are passed "
                      "over", sending.cmd_pause)  # fmt: skip
    sending.add_by_id(commands, "resume", "release a paused series by its id", sending.cmd_resume)
    api_commands.add_commands(commands)
    keypair.add_commands(commands)
    spark_command.add_commands(commands)
    return parser


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


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    if not args.yes:
        error(f"rebuild deletes every key of namespace {settings.namespace!r} and writes back "
               "what Kafka holds: stop every replica, then run it with --yes")  # fmt: skip
        return EXIT_USAGE
    try:
        counts = rebuild.rebuild(settings, accept_aged_out=args.accept_aged_out)
    except (rebuild.ReplicasRunning, rebuild.AgedOut, rebuild.StoreNeverFilled,
            readback.Unreadable) as e:  # fmt: skip
        error(str(e))
        return EXIT_USAGE
    done = log.warning if counts.refused else log.info  # refused now: lost, say so loudly
    done("rebuild_done", records=counts.records, written=counts.written,
             passed_over=dict(counts.passed_over), refused=counts.refused,
             refused_before=counts.refused_before, skipped=counts.skipped,
             aged_out_records=counts.aged_out_records, targets=sorted(counts.targets))  # fmt: skip
    return EXIT_OK


def cmd_fill_store(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.store_topic:
        error("fill-store writes to the store topic: set BLACKBOX_STORE_TOPIC")
        return EXIT_USAGE
    if not args.yes:
        error(f"fill-store writes every schedule pending in namespace {settings.namespace!r} "
              f"to {settings.store_topic}: stop every replica, then run it with --yes")  # fmt: skip
        return EXIT_USAGE
    # Checked first: a write to a missing topic would have the broker create it, not compacted.
    retention.check_store(settings.kafka, settings.store_topic)  # StoreTopicRefused: exit 2
    client = redis_client(settings.redis_url)
    layout = Layout(
        settings.namespace, settings.shards or shardcount.adopt(client, settings.namespace)
    )
    try:
        rebuild.refuse_if_running(client, layout, now_ms())
    except rebuild.ReplicasRunning as e:
        error(str(e))
        return EXIT_USAGE
    store = RedisStore(client, layout, settings.grace_seconds, settings.fired_retention)
    written = filling.fill(settings, store)
    log.info("fill_store_done", topic=settings.store_topic, written=written)
    return EXIT_OK

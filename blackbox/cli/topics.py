"""`blackbox create-topics`, and the topics `blackbox dev` prepares the same way: the intake,
dead-letter and events topics (and the intake topics the policy binds) created, and the
intake and dead-letter topics kept as long as the service's start check asks
(kafka/retention.py), so a first start warns of nothing that is not wrong."""

from __future__ import annotations

import argparse

import structlog

from blackbox.exits import EXIT_OK
from blackbox.intake.runner import caller_policy_of
from blackbox.kafka import clients, retention
from blackbox.settings import Settings

log = structlog.get_logger("blackbox.cli.topics")


def prepare(settings: Settings, partitions: int) -> list[str]:
    """Create the topics blackbox reads and writes where missing (with `partitions`), raise
    the retention of the intake and dead-letter topics to what the policy's longest horizon
    needs (never lowering one); the names of the topics."""
    policy = caller_policy_of(settings)
    names = [*settings.own_topics, *sorted(policy.bound_topics)]
    clients.ensure_topics(settings.kafka, names, partitions=partitions)
    intake = [settings.intake_topic, *sorted(policy.bound_topics)]
    needed = retention.needed_ms(policy.longest_horizon_seconds, settings.grace_seconds)
    # The dead-letter topic too: a rebuild reads there what was refused and what failed.
    raised = retention.raise_to(settings.kafka, [*intake, settings.dlq_topic], needed)
    for topic, before in raised.items():
        event = "dead_letter_retention_raised" if topic == settings.dlq_topic else None
        log.info(event or "intake_retention_raised", topic=topic, before_ms=before,
                 retention_ms=needed)  # fmt: skip
    log.info("topics_ready", topics=names, intake_retention_ms=needed)
    return names


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = commands.add_parser(
        "create-topics", help="create the intake, dead-letter and events topics"
    )
    topics.add_argument("--partitions", type=int, default=1,
                        help="partitions of each topic it creates")  # fmt: skip
    topics.set_defaults(command=cmd_create_topics)


def cmd_create_topics(args: argparse.Namespace, settings: Settings) -> int:
    prepare(settings, args.partitions)
    return EXIT_OK

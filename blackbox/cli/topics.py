"""`blackbox create-topics`, and the topics `blackbox dev` prepares the same way: the intake,
dead-letter and events topics (and the intake topics the policy binds) created, the store
topic too where one is set (compacted), and the intake and dead-letter topics kept as long
as the service's start check asks (kafka/retention.py), so a first start warns of nothing
that is not wrong. A store topic found not compacted alone is refused, never changed."""

from __future__ import annotations

import argparse

import structlog
from confluent_kafka import KafkaException

from blackbox.cli.sending import error
from blackbox.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from blackbox.intake.runner import caller_policy_of
from blackbox.kafka import clients, replication, retention
from blackbox.kafka.replication import Plan
from blackbox.settings import Settings

log = structlog.get_logger("blackbox.cli.topics")
# The most partitions or copies asked for: Kafka counts them in 32 bits.
MAX_COUNT = 2**31 - 1


def prepare(settings: Settings, partitions: int, copies: Plan | None = None) -> list[str]:
    """Create the topics blackbox reads and writes where missing (with `partitions`, and
    replicated as `copies` says, else as the cluster allows: replication.py), the store
    topic compacted (StoreTopicRefused if it exists otherwise), raise the retention of the
    intake and dead-letter topics to what they need (the policy's longest horizon, or a day
    beside a store topic; never lowering one); the names of the topics."""
    policy = caller_policy_of(settings)
    names = [*settings.own_topics, *sorted(policy.bound_topics)]
    copies = copies or replication.plan(settings.kafka)
    _create(settings, [n for n in names if n != settings.store_topic], partitions, copies)
    if settings.store_topic:
        _create(settings, [settings.store_topic], partitions, copies,
                {retention.CLEANUP: retention.COMPACT})  # fmt: skip
        retention.check_store(settings.kafka, settings.store_topic)
    replication.warn_if_weak(settings.kafka, names, copies)  # those that existed before
    intake = [settings.intake_topic, *sorted(policy.bound_topics)]
    needed = retention.intake_needed_ms(settings, policy)
    # The dead-letter topic too: a rebuild reads there what was refused and what failed.
    raised = retention.raise_to(settings.kafka, [*intake, settings.dlq_topic], needed)
    for topic, before in raised.items():
        event = "dead_letter_retention_raised" if topic == settings.dlq_topic else None
        log.info(event or "intake_retention_raised", topic=topic, before_ms=before,
                 retention_ms=needed)  # fmt: skip
    log.info("topics_ready", topics=names, intake_retention_ms=needed,
             replication_factor=copies.replication_factor,
             min_insync_replicas=copies.min_insync_replicas)  # fmt: skip
    return names


def _create(
    settings: Settings, names: list[str], partitions: int, copies: Plan,
    config: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """Create those of `names` that are missing, replicated as `copies` says, with `config`."""
    clients.ensure_topics(settings.kafka, names, partitions=partitions,
                          replication_factor=copies.replication_factor,
                          topic_config={**copies.topic_config, **(config or {})})  # fmt: skip


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = commands.add_parser(
        "create-topics",
        help="create the intake, dead-letter and events topics (and the store topic, compacted)",
    )
    topics.add_argument("--partitions", type=count, default=1,
                        help="partitions of each topic it creates")  # fmt: skip
    topics.add_argument("--replication-factor", type=count, default=None,
                        help="copies of each topic it creates (default: 3 on a cluster of 3 "
                        "brokers or more, else one per broker)")  # fmt: skip
    topics.add_argument("--min-insync-replicas", type=count, default=None,
                        help="the copies a record must reach before it counts as written "
                        "(default: 2 with 3 copies or more, else 1)")  # fmt: skip
    topics.set_defaults(command=cmd_create_topics)


def cmd_create_topics(args: argparse.Namespace, settings: Settings) -> int:
    factor, insync = args.replication_factor, args.min_insync_replicas
    if factor is not None and insync is not None and insync > factor:
        return _refused(f"--min-insync-replicas {insync}: more than the {factor} copies kept; "
                        "no record could be written")  # fmt: skip
    try:
        count = replication.brokers(settings.kafka)
        factor = factor or Plan.for_brokers(count).replication_factor
        insync = insync or Plan.for_brokers(factor).min_insync_replicas
        if factor > count:
            return _refused(f"--replication-factor {factor}: the cluster has {count} "
                            f"broker(s), so at most {count} copies")  # fmt: skip
        if insync > factor:
            return _refused(f"--min-insync-replicas {insync}: more than the {factor} copies "
                            "kept; no record could be written")  # fmt: skip
        prepare(settings, args.partitions, Plan(factor, insync))
    except KafkaException as e:
        error(f"Kafka did not answer: {e.args[0].str() if e.args else e}")
        return EXIT_FAILED
    return EXIT_OK


def _refused(text: str) -> int:
    error(text)
    return EXIT_USAGE


def count(text: str) -> int:
    """A count of at least 1 (argparse's type; its name is what argparse's error shows)."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= number <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count from 1 to {MAX_COUNT}")
    return number

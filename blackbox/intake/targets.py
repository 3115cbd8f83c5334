"""Targets: the topics the intake records to replay name, found before a rebuild deletes
anything. One the broker will not let blackbox describe or read (an ACL, a hostile record
naming a topic blackbox was never given) cannot show what was delivered to it: its
schedules are passed over and counted, and the rebuild goes on with the others.

A cheap first read: the `topic` of a JSON request or the `scheduler-target-topic` header;
for a consumer's retry request, the failed record's topic and those its inline backoff
names (`to`, `dead_letter`, else the topic + ".dlq"; one named in the caller's policy is
met when the replay applies it). No other check: a record refused later only costs a look
at its topic's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from confluent_kafka import Message

from blackbox import retries
from blackbox.envelope import TARGET_TOPIC_HEADER, legal_topic_name
from blackbox.errors import InvalidEnvelope
from blackbox.kafka import readback
from blackbox.kafka.clients import read_headers
from blackbox.kafka.readback import Extent


def named(config: Mapping[str, Any], spans: Mapping[tuple[str, int], tuple[int, int]]) -> set[str]:
    """Every legal topic name the records of `spans` ([start, end) per partition) target."""
    bounds = {where: Extent(start, end) for where, (start, end) in spans.items()}
    found: set[str] = set()
    for message, _ in readback.records(config, bounds):
        found.update(t for t in targets_of(message) if legal_topic_name(t))
    return found


def targets_of(message: Message) -> list[str]:
    """The topics one intake record may be delivered to, as far as it names them."""
    headers = read_headers(message) or []
    if retries.is_request(headers):
        return _retry_targets(headers)
    topic = target_of(message)
    return [] if topic is None else [topic]


def _retry_targets(headers: list[tuple[str, bytes | None]]) -> list[str]:
    try:
        retry, _ = retries.read(headers)
    except InvalidEnvelope:
        return []
    topic = retry.source.topic
    if isinstance(retry.policy, retries.Backoff):
        policy = retry.policy
        return [policy.to or topic, policy.dead_letter or topic + retries.DEAD_LETTER_SUFFIX]
    return [topic, topic + retries.DEAD_LETTER_SUFFIX]


def target_of(message: Message) -> str | None:
    """The topic one intake record names, if it names one."""
    for name, value in read_headers(message) or []:
        if name == TARGET_TOPIC_HEADER and isinstance(value, bytes):
            return value.decode("utf-8", "replace")
    value = message.value()
    if not value or not value.lstrip().startswith(b"{"):
        return None
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    topic = document.get("topic") if isinstance(document, dict) else None
    return topic if isinstance(topic, str) else None


def unreadable(config: Mapping[str, Any], topics: set[str]) -> dict[str, str]:
    """The topics of `topics` the broker will not describe, each with its error."""
    refused = {}
    for topic in sorted(topics):
        try:
            readback.extents_of(config, [topic])
        except readback.Unreadable as e:
            refused[topic] = str(e)
    return refused

"""A consumer's retry request applied: its backoff found in the caller's policy, and the
schedule it becomes, to its topic after the delay or, past its last attempt, to the
dead-letter topic at once (retries.py says what the request holds)."""

from __future__ import annotations

from dataclasses import replace

from blackbox import retries
from blackbox.envelope import Envelope, Limits, target_topic
from blackbox.intake.policy import Rule
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule


def resolved(envelope: Envelope, rule: Rule, received_ms: int, limits: Limits) -> Envelope:
    """The envelope a retry request stands for, ready to schedule like any other (the
    caller's policy then checks its topic, size and delay)."""
    retry = envelope.retry
    if retry is None:
        return envelope
    backoff = retries.backoff_of(retry, rule.retries)
    retry = retries.continued(retry, backoff)
    plan = retries.plan(retry, backoff, received_ms)
    return replace(
        envelope,
        topic=target_topic(plan.topic, limits),
        countdown_ms=plan.delay_ms,
        headers=(*envelope.headers, *plan.headers),
        schedule_id=plan.id,
        retry=replace(retry, exhausted=plan.exhausted),
        partition=plan.partition,
    )


def count(schedule: Schedule, metrics: Metrics) -> None:
    """Count a retry newly scheduled: for another attempt, or to its dead-letter topic
    (exhausted), by the topic it goes to (one the caller's policy allows)."""
    retry = schedule.retry
    if retry is None:
        return
    counter = metrics.retries_exhausted if retry.exhausted else metrics.retries_scheduled
    counter.labels(topic=schedule.topic).inc()

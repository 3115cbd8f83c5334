"""A consumer's retry request applied: its backoff found in the caller's policy, and the
schedule it becomes, to its topic after the delay or, past its last attempt, to the
dead-letter topic at once (retries.py says what the request holds)."""

from __future__ import annotations

from dataclasses import replace

from blackbox import retries
from blackbox.envelope import Envelope, Limits, target_topic
from blackbox.intake.policy import Rule
from blackbox.metrics import Metrics


def resolved(envelope: Envelope, rule: Rule, received_ms: int, limits: Limits) -> Envelope:
    """The envelope a retry request stands for, ready to schedule like any other (the
    caller's policy then checks its topic, size and delay)."""
    retry = envelope.retry
    if retry is None:
        return envelope
    plan = retries.plan(retry, retries.backoff_of(retry, rule.retries), received_ms)
    return replace(
        envelope,
        topic=target_topic(plan.topic, limits),
        countdown_ms=plan.delay_ms,
        headers=(*envelope.headers, *plan.headers),
        retry=replace(retry, exhausted=plan.exhausted),
    )


def count(envelope: Envelope, metrics: Metrics) -> None:
    """Count a retry request taken: scheduled again, or exhausted (dead-lettered)."""
    retry = envelope.retry
    if retry is None:
        return
    counter = metrics.retries_exhausted if retry.exhausted else metrics.retries_scheduled
    counter.labels(topic=retry.source.topic).inc()

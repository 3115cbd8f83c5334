"""How long the intake topics must keep requests (kafka/retention.py): pure rules."""

from __future__ import annotations

from blackbox.intake.policy import CallerPolicy, Rule, open_policy
from blackbox.kafka import retention


def test_the_longest_horizon_of_any_caller_plus_grace() -> None:
    """Guarantee 1: a request must stay in Kafka as long as it can be pending: the furthest
    ahead any caller may schedule, plus the grace firing has past its due time."""
    policy = CallerPolicy(Rule(("*",), 3600, 1024), {"billing": Rule(("*",), 7200, 1024)})
    assert policy.longest_horizon_seconds == 7200
    assert retention.needed_ms(policy.longest_horizon_seconds, 600) == 7_800_000
    assert retention.needed_ms(open_policy(60.5, 1).longest_horizon_seconds, 0) == 60_500


def test_forever_is_never_short() -> None:
    """retention.ms=-1 keeps records forever: never short, whatever is needed."""
    assert not retention.short(retention.FOREVER, 10**15)
    assert retention.short(1000, 1001)
    assert not retention.short(1001, 1001)


def test_a_size_cap_and_compaction_are_shortfalls_whatever_retention_ms_says() -> None:
    """Guarantee 1: retention.bytes (a size cap) and cleanup.policy with compact delete
    requests however long retention.ms is; -1 (no cap) and delete alone do not."""
    assert events(retention.Kept(-1, -1, "delete")) == []
    assert events(retention.Kept(None, None, None)) == []  # a broker that does not tell
    assert events(retention.Kept(-1, 1 << 30, "delete")) == ["intake_retention_size_capped"]
    assert events(retention.Kept(-1, -1, "compact")) == ["intake_topic_compacted"]
    assert events(retention.Kept(999, 0, "delete, compact")) == [
        "intake_retention_short",
        "intake_retention_size_capped",
        "intake_topic_compacted",
    ]


def events(kept: retention.Kept) -> list[str]:
    return [s.event for s in retention.shortfalls(kept, 1000)]

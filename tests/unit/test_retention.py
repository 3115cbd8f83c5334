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


def test_a_store_topic_must_exist_and_be_compacted_alone() -> None:
    """Guarantee 1: the store topic holds the only version of a schedule pending longer
    than the intake topics keep requests: `delete` in its cleanup.policy (alone or with
    compact) would delete it after retention.ms, and a missing topic would be created so
    by a first write. Compact alone passes; a broker that does not tell is passed over."""
    broker = "kafka-1:9092"
    assert retention.store_refusal("bb.store", retention.Kept(-1, -1, "compact"), broker) is None
    assert retention.store_refusal("bb.store", retention.Kept(), broker) is None  # Tansu
    missing = retention.store_refusal("bb.store", None, broker)
    assert missing is not None
    assert "BLACKBOX_STORE_TOPIC=bb.store" in missing
    assert "does not exist" in missing
    assert "blackbox create-topics" in missing
    fix = ("kafka-configs.sh --bootstrap-server kafka-1:9092 --alter --entity-type topics "
           "--entity-name bb.store --add-config cleanup.policy=compact")  # fmt: skip
    for policy in ("delete", "compact,delete", "delete,compact"):
        refusal = retention.store_refusal("bb.store", retention.Kept(3600, -1, policy), broker)
        assert refusal is not None, policy
        assert "BLACKBOX_STORE_TOPIC=bb.store" in refusal
        assert f"cleanup.policy={policy}," in refusal
        assert "retention.ms=3600" in refusal
        assert refusal.endswith(fix)


def test_beside_a_store_the_intake_retention_warning_names_the_one_day_window() -> None:
    """With a store topic, an intake topic keeping less than the day a re-read or rebuild
    reads past the committed offsets is named with that window and the store topic; without
    one, the warning speaks of schedules firing (the horizon), as before."""
    day = retention.STORE_WINDOW_SECONDS * 1000
    assert day == 86_400_000
    (beside,) = retention.shortfalls(retention.Kept(3_600_000, -1, "delete"), day, "bb.store")
    assert beside.event == "intake_retention_short"
    assert beside.found == {"retention_ms": 3_600_000, "needed_ms": day, "store_topic": "bb.store"}
    assert "one-day window (86400 s)" in beside.why
    assert "'bb.store'" in beside.why
    (alone,) = retention.shortfalls(retention.Kept(3_600_000, -1, "delete"), day)
    assert alone.found == {"retention_ms": 3_600_000, "needed_ms": day}
    assert "before their schedules fire" in alone.why

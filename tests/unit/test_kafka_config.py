"""Kafka client configuration precedence and the classification of delivery errors."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from blackbox.errors import DeadLetterReason, SettingsError
from blackbox.kafka.clients import consumer_config, lasting_reason, producer_config
from blackbox.kafka.outbox import NO_REPORT
from blackbox.settings import Settings


def test_consumer_defaults() -> None:
    """Without overrides the consumer gets our defaults, the group and the at-least-once recipe."""
    assert consumer_config(Settings.from_env({})) == {
        "bootstrap.servers": "localhost:9092",
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": "100",
        "auto.commit.interval.ms": "1000",
        "group.id": "blackbox",
        "enable.auto.offset.store": "false",
        "enable.auto.commit": "true",
    }


def test_consumer_forced_properties_beat_operator_overrides() -> None:
    """Guarantee 1: offsets are stored only after the work, whatever KAFKA_* says."""
    loaded = Settings.from_env(
        {
            "KAFKA_ENABLE_AUTO_OFFSET_STORE": "true",
            "KAFKA_CONSUMER_ENABLE_AUTO_OFFSET_STORE": "true",
            "KAFKA_CONSUMER_ENABLE_AUTO_COMMIT": "false",
        }
    )
    config = consumer_config(loaded)
    assert config["enable.auto.offset.store"] == "false"
    assert config["enable.auto.commit"] == "true"


def test_consumer_group_comes_from_blackbox_group_id() -> None:
    """The consumer group is BLACKBOX_GROUP_ID, not a stray KAFKA_GROUP_ID."""
    loaded = Settings.from_env({"BLACKBOX_GROUP_ID": "bb-eu", "KAFKA_GROUP_ID": "other"})
    assert consumer_config(loaded)["group.id"] == "bb-eu"


def test_consumer_operator_overrides_beat_defaults() -> None:
    """KAFKA_* beats our defaults, and KAFKA_CONSUMER_* beats KAFKA_*."""
    loaded = Settings.from_env(
        {
            "KAFKA_AUTO_OFFSET_RESET": "latest",
            "KAFKA_FETCH_WAIT_MAX_MS": "200",
            "KAFKA_CONSUMER_FETCH_WAIT_MAX_MS": "300",
            "KAFKA_BOOTSTRAP_SERVERS": "broker:9092",
        }
    )
    config = consumer_config(loaded)
    assert config["auto.offset.reset"] == "latest"
    assert config["fetch.wait.max.ms"] == "300"
    assert config["bootstrap.servers"] == "broker:9092"


def test_client_properties_do_not_cross_over() -> None:
    """A KAFKA_PRODUCER_* property never reaches the consumer, nor KAFKA_CONSUMER_* the producer."""
    loaded = Settings.from_env(
        {"KAFKA_PRODUCER_LINGER_MS": "50", "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"}
    )
    assert "session.timeout.ms" not in producer_config(loaded)
    assert consumer_config(loaded)["session.timeout.ms"] == "6000"
    assert "linger.ms" not in consumer_config(loaded)
    assert producer_config(loaded)["linger.ms"] == "50"


def test_producer_defaults() -> None:
    """With no overrides the producer is idempotent, acks=all, and times out with the delivery."""
    assert producer_config(Settings.from_env({})) == {
        "bootstrap.servers": "localhost:9092",
        "linger.ms": "2",
        "partitioner": "murmur2_random",
        "topic.metadata.propagation.max.ms": "5000",
        "message.timeout.ms": "10000",
        "enable.idempotence": "true",
        "acks": "all",
        "delivery.report.only.error": False,
    }


def test_the_firing_producer_does_not_wait_to_batch_unless_told() -> None:
    """Guarantee 6: a message due now is sent now; the operator's linger still wins."""
    assert producer_config(Settings.from_env({}), linger_ms=0)["linger.ms"] == "0"
    told = Settings.from_env({"KAFKA_PRODUCER_LINGER_MS": "7"})
    assert producer_config(told, linger_ms=0)["linger.ms"] == "7"


def test_only_the_producer_asking_for_it_reports_errors_alone() -> None:
    """Guarantee 1: a delivery is acked in Redis only after its success report, so no
    KAFKA_* setting may turn success reports off; the intake's producer turns them off itself."""
    loaded = Settings.from_env(
        {"KAFKA_DELIVERY_REPORT_ONLY_ERROR": "true",
         "KAFKA_PRODUCER_DELIVERY_REPORT_ONLY_ERROR": "true"}
    )  # fmt: skip
    assert producer_config(loaded)["delivery.report.only.error"] is False
    quiet = producer_config(Settings.from_env({}), report_only_errors=True)
    assert quiet["delivery.report.only.error"] is True


def test_an_unknown_topic_fails_before_the_message_times_out() -> None:
    """A missing topic must surface as unknown (dead-lettered), not as a timeout (retried)."""
    loaded = Settings.from_env({"BLACKBOX_DELIVERY_TIMEOUT": "3", "BLACKBOX_LEASE_SECONDS": "9"})
    config = producer_config(loaded)
    assert int(config["topic.metadata.propagation.max.ms"]) < int(config["message.timeout.ms"])
    overridden = producer_config(
        Settings.from_env({"KAFKA_PRODUCER_TOPIC_METADATA_PROPAGATION_MAX_MS": "700"})
    )
    assert overridden["topic.metadata.propagation.max.ms"] == "700"


def test_producer_forced_properties_beat_operator_overrides() -> None:
    """Guarantee 1: deliveries are idempotent and acked by all replicas, whatever KAFKA_* says."""
    loaded = Settings.from_env(
        {
            "KAFKA_ACKS": "1",
            "KAFKA_ENABLE_IDEMPOTENCE": "false",
            "KAFKA_PRODUCER_ACKS": "0",
            "KAFKA_PRODUCER_ENABLE_IDEMPOTENCE": "false",
        }
    )
    config = producer_config(loaded)
    assert config["acks"] == "all"
    assert config["enable.idempotence"] == "true"


def test_producer_operator_overrides_beat_defaults() -> None:
    """KAFKA_* beats our producer defaults, and KAFKA_PRODUCER_* beats KAFKA_*."""
    assert producer_config(Settings.from_env({"KAFKA_LINGER_MS": "20"}))["linger.ms"] == "20"
    loaded = Settings.from_env({"KAFKA_LINGER_MS": "20", "KAFKA_PRODUCER_LINGER_MS": "30"})
    assert producer_config(loaded)["linger.ms"] == "30"


@pytest.mark.parametrize(("seconds", "ms"), [("10", "10000"), ("2.5", "2500"), ("0.0105", "11")])
def test_message_timeout_derives_from_delivery_timeout(seconds: str, ms: str) -> None:
    """Guarantee 3: librdkafka gives up on a delivery after BLACKBOX_DELIVERY_TIMEOUT."""
    loaded = Settings.from_env({"BLACKBOX_DELIVERY_TIMEOUT": seconds})
    assert producer_config(loaded)["message.timeout.ms"] == ms


def test_sub_millisecond_delivery_timeout_never_means_infinite() -> None:
    """Guarantee 3: a tiny delivery timeout never becomes message.timeout.ms=0 (infinite)."""
    try:
        loaded = Settings.from_env({"BLACKBOX_DELIVERY_TIMEOUT": "0.0004"})
    except SettingsError as e:
        assert "BLACKBOX_DELIVERY_TIMEOUT" in str(e)
        return
    assert int(producer_config(loaded)["message.timeout.ms"]) >= 1


def test_message_timeout_cannot_be_overridden_past_the_lease() -> None:
    """Guarantee 3: KAFKA_MESSAGE_TIMEOUT_MS cannot stretch a delivery beyond the lease."""
    loaded = Settings.from_env(
        {"KAFKA_MESSAGE_TIMEOUT_MS": "600000", "KAFKA_PRODUCER_MESSAGE_TIMEOUT_MS": "600000"}
    )
    assert producer_config(loaded)["message.timeout.ms"] == "10000"


def test_configs_are_fresh_dicts() -> None:
    """Each call builds a new dict, so a caller's edits never leak into the settings."""
    loaded = Settings.from_env({})
    config = producer_config(loaded)
    config["bootstrap.servers"] = "elsewhere:9092"
    assert loaded.kafka["bootstrap.servers"] == "localhost:9092"
    assert producer_config(loaded) is not config


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (KafkaError.UNKNOWN_TOPIC_OR_PART, DeadLetterReason.UNKNOWN_TOPIC),
        (KafkaError._UNKNOWN_TOPIC, DeadLetterReason.UNKNOWN_TOPIC),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, DeadLetterReason.UNKNOWN_TOPIC),
        (KafkaError.TOPIC_EXCEPTION, DeadLetterReason.UNKNOWN_TOPIC),
        (KafkaError.MSG_SIZE_TOO_LARGE, DeadLetterReason.RECORD_TOO_LARGE),
        (KafkaError.RECORD_LIST_TOO_LARGE, DeadLetterReason.RECORD_TOO_LARGE),
        (KafkaError.INVALID_RECORD, DeadLetterReason.DELIVERY_FAILED),
        (KafkaError.POLICY_VIOLATION, DeadLetterReason.DELIVERY_FAILED),
    ],
)
def test_lasting_errors_have_a_reason(code: int, reason: DeadLetterReason) -> None:
    """Guarantee 1: an error retrying cannot fix maps to the dead-letter reason it will carry."""
    assert lasting_reason(KafkaError(code)) is reason


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
    ],
)
def test_passing_errors_have_no_reason(code: int) -> None:
    """Guarantee 5: timeouts and brokers away are retried, never dead-lettered."""
    assert lasting_reason(KafkaError(code)) is None


def test_missing_delivery_report_is_retried() -> None:
    """Guarantee 5: the outbox's 'no report before the deadline' error is not a lasting one."""
    assert lasting_reason(NO_REPORT) is None

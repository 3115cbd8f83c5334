"""What a rebuild writes back of one accepted request (intake/passover.py), what it reads
of a delivered record's headers (kafka/deliveries.py) and which intake records it replays
(intake/rebuild.py): pure logic, no Redis or Kafka."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from blackbox.intake import passover
from blackbox.intake.passover import Known, Reason
from blackbox.intake.rebuild import AgedOut, ranges, refuse_aged_out
from blackbox.kafka import readback
from blackbox.kafka.deliveries import BadHeader, Delivered, Deliveries, key_of
from blackbox.kafka.letters import Letters
from blackbox.kafka.readback import Extent
from blackbox.recurrence import Recurrence
from blackbox.schedule import Schedule, Series
from blackbox.storage.applying import Cancellation

TOPIC = "orders"


def _one_off(schedule_id: str = "@billing/pay", version: str = "in:0:7", due_ms: int = 5_000,
             *, if_absent: bool = False) -> Schedule:  # fmt: skip
    return Schedule(schedule_id, TOPIC, b"v", due_ms, origin=version, if_absent=if_absent)


def _delivered(schedule: Schedule, topic: str = TOPIC) -> Known:
    versions = {(topic, schedule.id, schedule.version): Delivered({None})}
    return Known(deliveries=Deliveries(versions=versions))


def test_a_version_delivered_on_its_own_topic_is_passed_over_and_ended() -> None:
    schedule = _one_off()
    known = _delivered(schedule)
    kept, reason = passover.judged(schedule, known, 1_000)
    assert reason is Reason.DELIVERED
    assert kept == Cancellation(schedule.id)  # a version written back before goes
    assert schedule.id in known.ended


def test_a_delivery_on_another_topic_hides_nothing() -> None:
    schedule = _one_off()
    kept, reason = passover.judged(schedule, _delivered(schedule, "attacker"), 1_000)
    assert (kept, reason) == (schedule, None)


def test_a_one_off_due_before_the_oldest_kept_record_is_aged_out() -> None:
    known = Known(deliveries=Deliveries(kept_from_ms={TOPIC: 6_000}))
    plain = _one_off("plain", "plain", due_ms=5_000)
    assert passover.judged(plain, known, 1_000)[1] is Reason.AGED_OUT
    later = _one_off(due_ms=7_000)
    assert passover.judged(later, known, 1_000) == (later, None)


def test_a_callers_one_off_aged_out_is_judged_again_on_its_latest_due_time() -> None:
    known = Known(deliveries=Deliveries(kept_from_ms={TOPIC: 6_000}))
    first = _one_off(due_ms=5_000)
    assert passover.judged(first, known, 1_000) == (first, None)
    assert known.aging == {first.id}
    assert passover.aged_out(first, known)
    first.due_ms = 7_000  # moved later
    assert not passover.aged_out(first, known)


def test_an_ended_id_is_taken_again_once_its_marker_ran_out() -> None:
    """The service keeps an ended id's marker for its retention from the end's record time:
    an if_absent create read later is new again, one read before is passed over."""
    delivered = _one_off(if_absent=True)
    known = _delivered(delivered)
    known.deliveries.versions[(TOPIC, delivered.id, delivered.version)].delivered_ms = 10_000
    known.retention_ms = 4_000
    passover.judged(delivered, known, 1_000)
    assert known.ended == {delivered.id: 10_000}
    soon = _one_off(version="in:0:8", if_absent=True)
    assert passover.judged(soon, known, 13_000)[1] is Reason.ENDED
    later = _one_off(version="in:0:9", if_absent=True)
    assert passover.judged(later, known, 14_000) == (later, None)
    assert not later.if_absent and delivered.id not in known.ended


def test_a_cancel_of_a_pending_id_ends_it_at_the_cancels_time() -> None:
    known = Known(retention_ms=4_000)
    pending = _one_off()
    passover.judged(pending, known, 1_000)
    passover.judged(Cancellation(pending.id), known, 2_000)
    assert known.ended == {pending.id: 2_000} and known.cancelled == {pending.id}
    passover.judged(Cancellation("@billing/never-sent"), known, 3_000)
    assert "@billing/never-sent" not in known.ended


def _series(limit: int, first_ms: int = 1_000) -> Schedule:
    rule = Recurrence(every_ms=1_000, anchor_ms=first_ms, limit=limit)
    series = Series(rule, first_ms)
    return Schedule("@billing/tick", TOPIC, b"v", first_ms, origin="in:0:1", series=series)


def test_a_limited_series_counts_occurrences_before_the_oldest_kept_record_as_delivered() -> None:
    """Its first deliveries aged out of the target topic: it never runs past its limit."""
    known = Known(deliveries=Deliveries(kept_from_ms={TOPIC: 3_500}))
    seen = (TOPIC, "@billing/tick", "in:0:1")
    known.deliveries.versions[seen] = Delivered({4_000})
    kept, reason = passover.judged(_series(limit=6), known, 500)
    assert reason is None and isinstance(kept, Schedule) and kept.series is not None
    assert (kept.series.fired, kept.series.occurrence_ms) == (4, 5_000)  # 1, 2, 3 s and 4 s
    assert passover.judged(_series(limit=3), known, 500)[1] is Reason.SERIES_ENDED


def test_a_series_too_long_to_count_is_passed_over() -> None:
    known = Known(deliveries=Deliveries(kept_from_ms={TOPIC: 10**13}))
    huge = _series(limit=passover.MAX_COUNTED + 1)
    assert passover.judged(huge, known, 500)[1] is Reason.SERIES_UNCOUNTED


def test_a_dead_letter_ends_the_versions_accepted_before_it_only() -> None:
    known = Known(letters=Letters(failed={"@billing/pay": 2_000}))
    assert passover.judged(_one_off(), known, 1_000)[1] is Reason.DEAD_LETTERED
    again = _one_off(version="in:0:9")
    assert passover.judged(again, known, 3_000) == (again, None)


def test_an_if_absent_create_of_an_ended_id_is_passed_over_until_the_id_is_sent_again() -> None:
    first = _one_off()
    known = _delivered(first)
    passover.judged(first, known, 1_000)
    retry = _one_off(version="in:0:8", if_absent=True)
    assert passover.judged(retry, known, 1_100)[1] is Reason.ENDED
    plain = _one_off(version="in:0:9")
    assert passover.judged(plain, known, 1_200) == (plain, None)
    assert "@billing/pay" not in known.ended


def test_a_plain_id_passed_over_writes_nothing() -> None:
    schedule = _one_off(schedule_id="in:0:7", version="in:0:7")
    schedule.origin = None
    assert passover.judged(schedule, _delivered(schedule), 1_000) == (None, Reason.DELIVERED)


@pytest.mark.parametrize("value", [b"9" * 30, b"9223372036854775808", b"-1", b"12a", b"\xd9\xa3"])
def test_an_occurrence_header_that_is_no_due_time_is_refused(value: bytes) -> None:
    with pytest.raises(BadHeader):
        key_of(TOPIC, [("blackbox-id", b"s"), ("blackbox-occurrence-ms", value)])


def test_the_last_header_of_each_name_is_blackboxs() -> None:
    most = str(2**63 - 1).encode()
    headers = [("blackbox-id", b"forged"), ("blackbox-version", b"forged"),
               ("blackbox-id", b"own"), ("blackbox-occurrence-ms", most)]  # fmt: skip
    assert key_of(TOPIC, headers) == ((TOPIC, "own", "forged"), 2**63 - 1)


def test_replay_runs_from_the_oldest_kept_record_to_the_end_and_refuses_a_loss() -> None:
    committed: dict[tuple[str, int], int | None] = {("in", 0): 10, ("in", 1): 4, ("in", 2): None}
    kept = {("in", 0): Extent(3, 12), ("in", 1): Extent(4, 4), ("in", 2): Extent(0, 0)}
    assert ranges(committed, kept) == {("in", 0): (3, 12)}
    with pytest.raises(AgedOut, match="--accept-aged-out"):
        refuse_aged_out(committed, kept, accept=False)
    assert refuse_aged_out(committed, kept, accept=True) == 7
    assert refuse_aged_out({("in", 0): 10}, {("in", 0): Extent(0, 12)}, accept=False) == 0


class _Topic:
    def __init__(self, error: KafkaError | None, partitions: int = 1) -> None:
        self.error, self.partitions = error, dict.fromkeys(range(partitions))


class _Broker:
    """What a consumer's metadata and watermark calls answer (readback.extents reads them)."""

    def __init__(self, topics: dict[str, _Topic]) -> None:
        self.topics = topics

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: self.topics[topic]} if topic in self.topics else {})

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        return 2, 5


def test_a_topic_not_authorized_is_unreadable_and_an_unknown_one_holds_nothing() -> None:
    unknown = _Topic(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    broker = _Broker({"orders": _Topic(None, 2), "gone": unknown})
    found = readback.extents(broker, ["orders", "gone", "never"])  # type: ignore[arg-type]
    assert found == {("orders", 0): Extent(2, 5), ("orders", 1): Extent(2, 5)}
    broker.topics["secret"] = _Topic(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(readback.Unreadable, match="secret"):
        readback.extents(broker, ["orders", "secret"])  # type: ignore[arg-type]

"""What intake writes to the store topic (intake/keeping.py), without processes: the
versions written ahead of Redis, byte for byte as intake.lua leaves them, and what is
written again after where Redis did otherwise."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from blackbox.intake.keeping import Keeping, held, is_series, moved
from blackbox.kafka.outbox import Record
from blackbox.kafka.storetopic import CANCELLED, ENDED_HEADER, FIRED, StoreTopic
from blackbox.metrics import Metrics
from blackbox.recurrence import Recurrence
from blackbox.schedule import Schedule, Series
from blackbox.storage.applying import Applied, Cancellation, Holding, Move

TOPIC = "blackbox.store"


class _Written(StoreTopic):
    """A store topic that keeps what it was asked to write (no broker)."""

    def __init__(self) -> None:
        super().__init__(TOPIC, None, Metrics())  # type: ignore[arg-type]
        self.written: list[Record] = []

    def write(self, records: Sequence[Record], stop: threading.Event | None = None) -> None:
        self.written += records


class _Held:
    """What Redis holds, by id (RedisStore.payloads' answer)."""

    reader = None  # inline mode: no reference to read back

    def __init__(self, payloads: dict[str, bytes], markers: dict[str, bytes]) -> None:
        self.held = payloads
        self.markers = markers
        self.asked: list[str] = []

    def payloads(self, ids: Sequence[str]) -> list[bytes | None]:
        self.asked += ids
        return [self.held.get(i) for i in ids]

    def ended_markers(self, ids: Sequence[str]) -> list[bytes | None]:
        return [self.markers.get(i) for i in ids]


def _one_off(schedule_id: str = "@c/a", due_ms: int = 1_000) -> Schedule:
    return Schedule(schedule_id, "t", b"m", due_ms, caller=b"c", origin="in:0:1")


def _series() -> Schedule:
    rule = Recurrence(every_ms=60_000)
    return Schedule("@c/s", "t", b"m", 60_000, caller=b"c", origin="in:0:2",
                    series=Series(rule, 60_000))  # fmt: skip


def _keeping(
    held_now: dict[str, bytes], markers: dict[str, bytes] | None = None
) -> tuple[Keeping, _Written, _Held]:
    topic, redis_held = _Written(), _Held(held_now, markers or {})
    return Keeping(topic, redis_held), topic, redis_held  # type: ignore[arg-type]


def test_a_move_changes_the_due_time_bytes_only_and_leaves_a_series_alone() -> None:
    raw = _one_off(due_ms=1_000).encode()
    after = moved(raw, 5_000)
    assert after is not None
    assert Schedule.decode("@c/a", after) == _one_off(due_ms=5_000)
    assert moved(_series().encode(), 5_000) is None


def test_a_pause_sets_the_paused_flag_of_a_series_and_a_resume_clears_it() -> None:
    raw = _series().encode()
    paused = held(raw, paused=True)
    assert paused is not None and is_series(paused)
    decoded = Schedule.decode("@c/s", paused)
    assert decoded.series is not None and decoded.series.paused
    assert held(paused, paused=False) == raw
    assert held(_one_off().encode(), paused=True) is None


def test_ahead_writes_each_version_and_a_cancels_tombstone_in_order() -> None:
    keeping, _, redis_held = _keeping({})
    records, _, _ = keeping.ahead_records([_one_off("@c/a"), Cancellation("@c/b")])
    assert [(r.key, r.value) for r in records] == [
        (b"@c/a", _one_off("@c/a").encode()), (b"@c/b", None),
    ]  # fmt: skip
    assert list(records[1].headers) == [(ENDED_HEADER, CANCELLED)]
    assert redis_held.asked == []  # nothing read from Redis for plain requests


def test_ahead_moves_what_an_earlier_request_of_the_poll_wrote_else_what_redis_holds() -> None:
    stored = _one_off("@c/a", due_ms=1_000)
    keeping, _, _ = _keeping({"@c/a": stored.encode(), "@c/s": _series().encode()})
    records, _, _ = keeping.ahead_records([
        Move("@c/a", b"c", 2_000),  # from Redis's version
        _one_off("@c/x", due_ms=3_000), Move("@c/x", b"c", 4_000),  # from the poll's own
        Move("@c/s", b"c", 9_000),  # a series: unchanged, nothing written
        Holding("@c/s", b"c", paused=True), Move("@c/none", b"c", 1),  # not pending
    ])  # fmt: skip
    decoded = [Schedule.decode((r.key or b"").decode(), r.value or b"") for r in records]
    assert [(s.id, s.due_ms) for s in decoded] == [
        ("@c/a", 2_000), ("@c/x", 3_000), ("@c/x", 4_000), ("@c/s", 60_000),
    ]  # fmt: skip
    assert decoded[3].series is not None and decoded[3].series.paused


def test_after_writes_what_redis_holds_only_where_it_did_otherwise() -> None:
    keeping, topic, _ = _keeping({"@c/pending": b"\x01held"}, {"@c/fired": b"f"})
    keeping.after([
        (_one_off("@c/new"), Applied.SCHEDULED), (_one_off("@c/up"), Applied.UPDATED),
        (Cancellation("@c/gone"), Applied.NOT_FOUND), (Move("@c/m", None, 5), Applied.UPDATED),
        (_one_off("@c/pending"), Applied.ALREADY_PENDING),  # if_absent: Redis kept its own
        (_one_off("@c/fired"), Applied.ALREADY_FIRED),  # ended: the version written goes
        (Holding("@c/h", None, paused=True), Applied.NOT_RECURRING),
    ], threading.Event())  # fmt: skip
    assert sorted((r.key, r.value) for r in topic.written) == [
        (b"@c/fired", None), (b"@c/gone", None), (b"@c/h", None), (b"@c/pending", b"\x01held"),
    ]  # fmt: skip
    told = {r.key: list(r.headers) for r in topic.written}
    assert told[b"@c/fired"] == [(ENDED_HEADER, FIRED)]  # its marker: the rebuild's too
    assert told[b"@c/h"] == []  # no marker: not told
    assert told[b"@c/gone"] == []  # a cancel of an id never pending: Redis keeps no marker

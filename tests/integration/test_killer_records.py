"""A record that kills the real `blackbox run` process (tests/dying.py stands in for a native
crash) among good records of other callers on other partitions: restarted after each death,
as Kubernetes would, the intake sets aside the killer alone and delivers everything else."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason
from blackbox.intake.crashguard import CRASH_LIMIT
from blackbox.kafka import clients
from blackbox.settings import Settings
from tests.dying import DIES_IN, KILLER
from tests.integration.conftest import ReaderFactory
from tests.kafkatools import unique, wait_until
from tests.process import BlackboxProcess

PARTITIONS = 4
# The caller of each partition's good records; the killer comes from its own caller.
CALLERS = ("billing", "orders", "shipping", "billing")
MALLORY = "mallory"
# Records of each good caller per partition, in the first batch and in the second.
PER_PARTITION = 3
# A restart waits for the killed member to leave the group (session timeout 6 s).
LIFE_SECONDS = 90

Record = tuple[int, str, str, bytes]  # partition, caller, id, value


def _good(target: str, batch: int, partition: int, n: int) -> Record:
    schedule_id = f"order-{partition}-{batch}-{n}"
    value = {"topic": target, "message": schedule_id, "countdown": 0, "id": schedule_id}
    return partition, CALLERS[partition], schedule_id, orjson.dumps(value)


def _produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    """Each record to its partition, keyed by its id, with its caller's header."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, caller, key, value in records:
        producer.produce(topic, value, key.encode(), partition=partition,
                         headers=[(CALLER_HEADER, caller.encode())])  # fmt: skip
    assert producer.flush(30) == 0


def _committed(settings: Settings) -> list[int]:
    """The group's committed offset of each intake partition (-1001 where none)."""
    consumer = Consumer({"bootstrap.servers": settings.kafka["bootstrap.servers"],
                         "group.id": settings.group_id})  # fmt: skip
    try:
        asked = [TopicPartition(settings.intake_topic, p) for p in range(PARTITIONS)]
        return [tp.offset for tp in consumer.committed(asked, timeout=10)]
    finally:
        consumer.close()


def _dying(env: dict[str, str], log: Path) -> BlackboxProcess:
    """`blackbox run` that dies when it touches the killer (where: env[DIES_IN])."""
    return BlackboxProcess(env, log, "run", program=(sys.executable, "-m", "tests.dying"))


def _run_until_done(
    env: dict[str, str], settings: Settings, logs: Path, ends: list[int],
    delivered: Callable[[], bool],
) -> int:  # fmt: skip
    """Start the dying `blackbox run` again after each death until it commits every offset
    up to `ends` and `delivered()` holds (a schedule applied by a process that died may
    wait for that process's shards to come back); stop it then; return the deaths."""
    deaths = 0
    while True:
        process = _dying(env, logs / f"run-{deaths}.log")
        wait_until(lambda p=process: p.process.poll() is not None  # type: ignore[misc]
                   or (_committed(settings) == ends and delivered()), timeout=LIFE_SECONDS,
                   what="a death, or every intake offset committed and delivered")  # fmt: skip
        if process.process.poll() is None:
            assert process.terminate() == 0
            return deaths
        process.wait()
        deaths += 1
        assert deaths <= CRASH_LIMIT + 1, "the guard never set the killer aside"


def _killer(target: str, dies_in: str) -> Record:
    """The record that kills the intake: its value when parsed, or its schedule's answer
    when encoded (a valid request, applied before the death)."""
    if dies_in == "parsing":
        return 3, MALLORY, "killer", orjson.dumps({"topic": target, "message": KILLER.decode()})
    own = KILLER.decode()
    return 3, MALLORY, own, orjson.dumps({"topic": target, "message": "m", "id": own,
                                          "countdown": 3600})  # fmt: skip


@pytest.mark.parametrize("dies_in", ["parsing", "answering"])
def test_only_the_record_that_kills_the_intake_is_set_aside(
    env: dict[str, str], reader: ReaderFactory, tmp_path: Path, dies_in: str
) -> None:
    """Guarantee 4 (one record never stops a partition, and one caller never harms another):
    with committed offsets on 4 partitions, a record on partition 3 that kills the process
    when parsed, polled together with good records of other callers on partitions 0-2, is
    the only record dead-lettered (`unreadable`, its headers kept, its answer naming its
    caller); every good record is delivered, however many restarts it took. The same where
    the process dies after the record was applied, while its answer is encoded."""
    env = {**env, DIES_IN: dies_in}
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, [settings.intake_topic], PARTITIONS)
    clients.ensure_topics(settings.kafka, settings.own_topics)
    bootstrap = settings.kafka["bootstrap.servers"]
    target = unique("isolated")
    delivered = reader(target)

    first = [_good(target, 1, p, n) for p in range(PARTITIONS) for n in range(PER_PARTITION)]
    _produce(bootstrap, settings.intake_topic, first)
    running = _dying(env, tmp_path / "first.log")
    delivered.wait_count(len(first))
    wait_until(lambda: _committed(settings) == [PER_PARTITION] * PARTITIONS,
               what="the first batch committed")  # fmt: skip
    assert running.terminate() == 0

    # Behind the committed offsets: the killer first on partition 3, good records elsewhere.
    killer = _killer(target, dies_in)
    second = [_good(target, 2, p, n) for p in range(3) for n in range(PER_PARTITION)]
    second += [killer, _good(target, 2, 3, 0)]
    _produce(bootstrap, settings.intake_topic, second)
    ends = [2 * PER_PARTITION] * 3 + [PER_PARTITION + 2]
    good = len(first) + len(second) - 1

    def all_delivered() -> bool:
        delivered.poll(timeout=0.1)
        return len({r.value for r in delivered.records}) >= good

    deaths = _run_until_done(env, settings, tmp_path, ends, all_delivered)

    letters = reader(settings.dlq_topic).read_to_end()
    where = [(r.header("blackbox-dlq-partition"), r.header("blackbox-dlq-offset")) for r in letters]
    assert where == [("3", str(PER_PARTITION))], "only the killer is set aside"
    (letter,) = letters
    assert letter.header("blackbox-dlq-reason") == DeadLetterReason.UNREADABLE
    assert (letter.value, letter.key) == (killer[3], killer[2].encode())
    assert letter.header(CALLER_HEADER) == MALLORY, "the killer's headers are kept"
    got = {(r.value or b"").decode() for r in delivered.read_to_end()}  # a string goes as is
    assert got == {orjson.loads(v)["message"] for *_, v in first + second if v != killer[3]}
    answers = [orjson.loads(r.value or b"") for r in reader(settings.events_topic).read_to_end()]
    refused = [a for a in answers if a["outcome"] == "dead_lettered"]
    assert [(a["caller"], a["id"], a["intake"]["partition"]) for a in refused] == [
        (MALLORY, killer[2], 3)
    ]
    assert deaths >= CRASH_LIMIT

"""The retry examples (examples/java/RetryConsumer.java, examples/go/retry), run as a user
runs them, against records written by Debian's kcat: each record fails once, comes back
through blackbox after its backoff on its own partition, its key, value and headers byte for
byte (binary keys, non-UTF-8 and empty header values, repeated names, in order), and is
processed once more (issue 51)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from blackbox import retries
from blackbox.envelope import CALLER_HEADER, normalize_headers
from blackbox.kafka import clients
from tests.integration.conftest import ServiceFactory, settle
from tests.integration.test_examples import EXAMPLES, GO_PLACES, _run, _tool
from tests.integration.test_retries import kcat_produce
from tests.kafkatools import unique

PARTITIONS = 3
# Each record: its key, value and header arguments as kcat writes them (-H name=value).
RECORDS = [
    (b"k\x00\xff1", b"\x00first\xff", [b"trace=\xff\xfe", b"kind=a", b"kind=b", b"empty="]),
    (b"k\x00\xff2", b"\x00second\xfe", [b"trace=\x80", b"empty=", b"kind=c"]),
    (b"k3", b"third", [b"kind=d", b"kind=d"]),
]
FIRST_DELAY_MS = 1000  # the examples' policy, {"delays": [1, 5, 30]}: 1 s after a first failure
# Longer than any run needs: the test stops the consumer once it has printed every line.
SECONDS = "120"


@dataclass(frozen=True)
class Record:
    """A record read back with its headers as a list: in order, repeated names kept."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    created_ms: int


def read_all(bootstrap: str, topic: str) -> list[Record]:
    """Every record `topic` holds now (Apache Kafka's end offsets are exact)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                         "enable.auto.commit": False})  # fmt: skip
    try:
        places = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in places}
        consumer.assign(places)
        found: list[Record] = []
        while len(found) < sum(ends.values()):
            message = consumer.poll(10)
            assert message is not None and message.error() is None, message
            found.append(Record(message.partition() or 0, message.offset() or 0, message.key(),
                                message.value(), normalize_headers(message.headers()),
                                message.timestamp()[1]))  # fmt: skip
        return found
    finally:
        consumer.close()


def run_until_printed(command: list[str], env: dict[str, str], count: int, log: Path) -> list[str]:
    """Run a consumer until it has printed `count` lines (or exited, or 120 s passed), stop
    it, and return every line it printed."""
    lines: list[str] = []
    with (
        log.open("w") as stderr,
        subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE,
                         stderr=stderr, text=True) as process,
    ):  # fmt: skip
        reading = threading.Thread(target=_collect, args=(process, lines))
        reading.start()
        deadline = time.monotonic() + 120
        while len(lines) < count and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        process.terminate()
        reading.join(30)
    assert len(lines) >= count, f"{command[0]} printed {lines}; its log:\n{log.read_text()}"
    return lines


def _collect(process: subprocess.Popen[str], lines: list[str]) -> None:
    for line in process.stdout or ():
        lines.append(line.rstrip("\n"))


def consume_with_example(
    start_service: ServiceFactory, env: dict[str, str], command: list[str], log: Path
) -> None:
    """Three kcat records on a topic of three partitions consumed by the example `command`;
    each fails once, comes back once, byte for byte, on its partition, and succeeds."""
    service = start_service()
    bootstrap, topic = env["KAFKA_BOOTSTRAP_SERVERS"], unique("orders")
    clients.ensure_topics(service.settings.kafka, [topic], partitions=PARTITIONS)
    for key, value, headers in RECORDS:
        kcat_produce(bootstrap, topic, key, value, headers)
    originals = read_all(bootstrap, topic)
    assert len({r.partition for r in originals}) > 1  # the keys spread out
    caller = unique("orders-worker")  # its consumer group too
    printed = run_until_printed([*command, topic, SECONDS], env | {"BLACKBOX_CALLER": caller},
                                2 * len(RECORDS), log)  # fmt: skip
    settle(service)  # every retry delivered: the topic holds all it ever will
    delivered = read_all(bootstrap, topic)
    assert sorted(printed) == sorted(came_back_once(originals, delivered, topic, caller))


def came_back_once(
    originals: list[Record], delivered: list[Record], topic: str, caller: str
) -> list[str]:
    """Check that each original came back exactly once, at attempt 2, after the policy's
    first delay, on its partition, its key, value and own headers (in order) byte for byte,
    then only blackbox's and the caller's. Returns the lines the consumer must have printed
    for the originals and their retries."""
    assert len(delivered) == 2 * len(originals)
    lines = []
    for original in originals:
        [again] = [r for r in delivered if r.value == original.value and r != original]
        assert (again.key, again.partition) == (original.key, original.partition)
        own = len(original.headers)
        assert again.headers[:own] == original.headers
        assert all(name.startswith("blackbox-") or name == CALLER_HEADER
                   for name, _ in again.headers[own:])  # fmt: skip
        added, source = dict(again.headers[own:]), f"{topic}/{original.partition}"
        assert added[retries.OF_HEADER] == f"{source}/{original.offset}".encode()
        assert (added[retries.ATTEMPT_HEADER], added[CALLER_HEADER]) == (b"2", caller.encode())
        [failure] = orjson.loads(added[retries.HISTORY_HEADER] or b"")
        assert again.created_ms - failure["at_ms"] >= FIRST_DELAY_MS - 5, failure
        lines += [f"processed {source}/{original.offset} attempt 1 failed",
                  f"processed {source}/{again.offset} attempt 2 ok"]  # fmt: skip
    return lines


@pytest.mark.timeout(400)
def test_java_retry_consumer_gets_each_failed_record_back_byte_for_byte(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """The Java consumer loop (kafka-clients alone) sends a failed record's retry, commits
    after its acknowledgement, and gets the record back once, byte for byte, on its
    partition, at attempt 2."""
    lib = tmp_path / "lib"
    _run([_tool("mvn"), "-q", "-B", "-f", str(EXAMPLES / "java" / "pom.xml"),
          "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
          f"-DoutputDirectory={lib}"], env)  # fmt: skip
    command = [_tool("java"), "-cp", f"{lib}/*", str(EXAMPLES / "java" / "RetryConsumer.java")]
    consume_with_example(start_service, env, command, tmp_path / "java.log")


@pytest.mark.timeout(400)
def test_go_retry_consumer_gets_each_failed_record_back_byte_for_byte(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """The Go consumer loop (kafka-go's Reader and Writer) sends a failed record's retry,
    commits after its acknowledgement, and gets the record back once, byte for byte, on its
    partition, at attempt 2."""
    binary = tmp_path / "retry-consumer"
    _run([_tool("go", *GO_PLACES), "build", "-o", str(binary), "./retry"], env,
         cwd=EXAMPLES / "go", timeout=360)  # fmt: skip
    consume_with_example(start_service, env, [str(binary)], tmp_path / "go.log")

"""Reading schedules back from the store topic by the place Redis keeps (index mode).

Firing, the API and intake's moves read the encodings that index mode's references
(storage/reference.py) point to: the places asked for at once are sorted per partition,
and each run of nearby offsets is read once from its first. A bounded cache keeps what
this process wrote or read lately, so firing what intake stored within the cache's reach
reads nothing back. A place whose record is not the id's (compacted away, or the topic
emptied) reads as missing: firing dead-letters it (`store_record_missing`). Firing asks for the
references of all the claims of one round at once (one pass over a burst's records), and
read-ahead (firing/readahead.py) fills the cache with what falls due soon.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, TopicPartition

from blackbox.kafka.storetopic import StoreUnavailable
from blackbox.metrics import Metrics
from blackbox.reference import Reference, is_reference, resolved

log = structlog.get_logger("blackbox.kafka.storereader")

# Offsets closer than this are read in one run rather than by a new start (a fetch).
RUN_GAP = 2000
_BATCH = 1000
# consume() returns once it holds _BATCH records or this passed: a run of a few records
# must not wait for more that never come.
_POLL_SECONDS = 0.005

Place = tuple[int, int]  # (partition, offset)


class StoreReader:
    """Reads store records by place, through a bounded cache (module docstring)."""

    def __init__(
        self, config: Mapping[str, Any], topic: str, cache_bytes: int, metrics: Metrics,
        wait_seconds: float = 30.0,
    ) -> None:  # fmt: skip
        self.config = dict(config)
        self.topic = topic
        self.cache_bytes = cache_bytes
        self.metrics = metrics
        self.wait_seconds = wait_seconds
        self._cache: OrderedDict[Place, tuple[bytes, bytes]] = OrderedDict()
        self._cached_bytes = 0
        self._cache_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._consumer: Consumer | None = None

    def remember(self, key: bytes, value: bytes, place: Place) -> None:
        """Keep a record this process wrote (or read) at `place`, the oldest let go."""
        size = len(key) + len(value)
        if size > self.cache_bytes:
            return
        with self._cache_lock:
            if place in self._cache:
                return
            self._cache[place] = (key, value)
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes:
                _, (old_key, old_value) = self._cache.popitem(last=False)
                self._cached_bytes -= len(old_key) + len(old_value)

    def resolve(self, ids: Sequence[str], payloads: Sequence[bytes | None]) -> list[bytes | None]:
        """Each payload as an encoding: a reference replaced by its record's value, due at
        the reference's time; None where its record is missing. StoreUnavailable where the
        store cannot be read within the wait."""
        wanted = [(i, Reference.decode(p)) for i, p in zip(ids, payloads, strict=True)
                  if p is not None and is_reference(p)]  # fmt: skip
        if not wanted:
            return list(payloads)
        found = self.values(wanted)
        return [
            (found.get(i) if p is not None and is_reference(p) else p)
            for i, p in zip(ids, payloads, strict=True)
        ]

    def values(self, wanted: Sequence[tuple[str, Reference]]) -> dict[str, bytes]:
        """The encoding each (id, reference) stands for, by id; ids whose record is not
        there are left out."""
        records = self._records({(r.partition, r.offset) for _, r in wanted})
        found: dict[str, bytes] = {}
        for schedule_id, ref in wanted:
            record = records.get((ref.partition, ref.offset))
            if record is not None and record[0] == schedule_id.encode("utf-8"):
                found[schedule_id] = resolved(ref, record[1])
        return found

    def _records(self, places: set[Place]) -> dict[Place, tuple[bytes, bytes]]:
        found: dict[Place, tuple[bytes, bytes]] = {}
        with self._cache_lock:
            for place in places:
                hit = self._cache.get(place)
                if hit is not None:
                    self._cache.move_to_end(place)
                    found[place] = hit
        self.metrics.store_reads.labels(source="cache").inc(len(found))
        left = sorted(places - found.keys())
        if left:
            with self._read_lock:
                read = self._read(left)
            self.metrics.store_reads.labels(source="topic").inc(len(left))
            for place, record in read.items():
                self.remember(record[0], record[1], place)
            found.update(read)
        return found

    def _read(self, places: Sequence[Place]) -> dict[Place, tuple[bytes, bytes]]:
        """The records at `places` (sorted), read run by run."""
        deadline = time.monotonic() + self.wait_seconds
        found: dict[Place, tuple[bytes, bytes]] = {}
        for partition, offsets in _runs(places):
            self._read_run(partition, offsets, found, deadline)
        return found

    def _read_run(
        self, partition: int, offsets: list[int], found: dict[Place, tuple[bytes, bytes]],
        deadline: float,
    ) -> None:  # fmt: skip
        consumer = self._open()
        wanted, last = set(offsets), offsets[-1]
        consumer.assign([TopicPartition(self.topic, partition, offsets[0])])
        while True:
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"the store topic {self.topic!r} could not be read back within "
                    f"{self.wait_seconds:g} s (partition {partition}, offsets {offsets[0]} "
                    f"to {last})"
                )
            for message in consumer.consume(_BATCH, timeout=_POLL_SECONDS):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    raise StoreUnavailable(f"the store topic {self.topic!r}: {error.str()}")
                if message.partition() != partition:
                    continue
                offset = message.offset() or 0
                key, value = message.key(), message.value()
                if offset in wanted and key is not None and value is not None:
                    found[(partition, offset)] = (key, value)
                if offset >= last:
                    return

    def _open(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                **self.config, "group.id": "blackbox-store-reader", "enable.auto.commit": False,
                # A place past the partition's end (or before its start) names no record:
                # read from the end, it ends at once as missing, where "earliest" would
                # read the whole partition first.
                "enable.partition.eof": True, "auto.offset.reset": "latest",
                "fetch.wait.max.ms": 10,
            })  # fmt: skip
        return self._consumer

    def close(self) -> None:
        with self._read_lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def _runs(places: Sequence[Place]) -> list[tuple[int, list[int]]]:
    """Sorted places as runs of one partition whose offsets lie within RUN_GAP of the
    previous one."""
    runs: list[tuple[int, list[int]]] = []
    for partition, offset in places:
        if runs and runs[-1][0] == partition and offset - runs[-1][1][-1] <= RUN_GAP:
            runs[-1][1].append(offset)
        else:
            runs.append((partition, [offset]))
    return runs

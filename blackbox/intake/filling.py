"""Filling: a store topic made to hold every schedule pending, once, before the service
keeps it (kafka/storetopic.py).

A store topic set on a namespace with schedules pending holds none of them: a rebuild
from it would lose them. `blackbox fill-store --yes` (every replica stopped) writes each
pending schedule's version from Redis to the store, then a record saying so (FILLED_KEY)
and, in Redis, the store's name under the namespace (`Layout.store_filled`). The service
refuses to start on a store not filled for its namespace, but where nothing is pending (a
new namespace, or one flushed: the store kept what it held), where it marks it filled
itself. A rebuild from the store refuses a store never filled. Where the namespace was
filled as another store topic (a move to a new one), the references index mode keeps name
that topic's records: each is read back from it, written, and Redis pointed at the copy.
"""

from __future__ import annotations

import structlog
from confluent_kafka import KafkaException

from blackbox import reference
from blackbox.clock import now_ms
from blackbox.errors import SettingsError
from blackbox.kafka import clients
from blackbox.kafka.outbox import Outbox, Record
from blackbox.kafka.storereader import StoreReader
from blackbox.kafka.storetopic import StoreTopic, StoreUnavailable, filled_record
from blackbox.metrics import Metrics
from blackbox.reference import is_reference
from blackbox.schedule import caller_from_prefix
from blackbox.settings import Settings
from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore, pending_counts

log = structlog.get_logger("blackbox.intake.filling")
# Pending ids read from Redis and written to the store per round.
FILL_PART = 1000
FILL_COMMAND = "blackbox fill-store --yes"
# What a reader of the former store topic keeps (fill-store reads each record once).
FORMER_CACHE_BYTES = 1 << 20


class StoreNotFilled(SettingsError):
    """The store topic does not hold what Redis holds pending."""


def filled(client: RedisClient, layout: Layout, topic: str) -> bool:
    """Whether the namespace's store was filled as `topic`."""
    return client.get(layout.store_filled) == topic.encode("utf-8")


def check(settings: Settings, client: RedisClient, layout: Layout) -> bool:
    """At start, with a store topic set: True where it was filled for the namespace, or
    where nothing is pending and it is marked filled now (False: the broker did not take
    the mark; asked again at the next probe); else StoreNotFilled."""
    topic = settings.store_topic
    if not topic or filled(client, layout, topic):
        return True
    if pending_counts(client, layout) != (0, 0):
        raise StoreNotFilled(
            f"BLACKBOX_STORE_TOPIC={topic} holds none of the schedules pending in namespace "
            f"{settings.namespace!r}: a rebuild from it would lose them. Stop every replica, "
            f"run `{FILL_COMMAND}` once with these settings, then start them."
        )
    try:
        mark(settings, client, layout)
    except (StoreUnavailable, KafkaException) as e:
        log.warning("store_not_marked", error=str(e), retry="at the next probe")
        return False
    return True


def fill(settings: Settings, store: RedisStore) -> int:
    """Write every pending schedule's version to the store topic, then the record and the
    Redis mark that say so; how many were written."""
    outbox = Outbox(clients.new_producer(settings), settings.delivery_timeout + 1.0)
    topic = StoreTopic(settings.store_topic, outbox, Metrics())
    former = _former_store(settings, store)
    indexing = settings.storage_mode == "index"
    written = 0
    try:
        for ids in _pending_ids(store):
            written += _fill_part(topic, store, ids, former, indexing=indexing)
        topic.write([filled_record(topic.topic, settings.namespace, now_ms())])
    finally:
        outbox.close()
        if former is not None:
            former.close()
    store.client.set(store.layout.store_filled, settings.store_topic)
    log.info("store_filled", topic=settings.store_topic, written=written)
    return written


def _former_store(settings: Settings, store: RedisStore) -> StoreReader | None:
    """A reader of the store topic the namespace was filled as, where that is another one:
    the references Redis holds (index mode) name its records, not the new topic's."""
    was: bytes | None = store.client.get(store.layout.store_filled)  # type: ignore[assignment]
    if was is None or was.decode("utf-8") == settings.store_topic:
        return None
    return StoreReader(settings.kafka, was.decode("utf-8"), FORMER_CACHE_BYTES, Metrics())


def _fill_part(
    topic: StoreTopic, store: RedisStore, ids: list[str], former: StoreReader | None,
    *, indexing: bool,
) -> int:  # fmt: skip
    """Write one part's pending versions; how many. A reference to the former store's
    record (`former`) is read back, written, and Redis pointed at what was written: a
    reference in index mode, else the encoding. Without a former store, a reference names
    a record this store holds already."""
    held = store.payloads(ids)
    values = held if former is None else former.resolve(ids, held)
    parts = [(i, h, v) for i, h, v in zip(ids, held, values, strict=True)
             if h is not None and v is not None and not is_reference(v)]  # fmt: skip
    lost = [i for i, h, v in zip(ids, held, values, strict=True) if is_reference(h) and v is None]
    if former is not None and lost:
        log.error("store_record_missing", topic=former.topic, ids=lost[:20], count=len(lost))
    places = topic.write_placed([Record(topic.topic, v, i.encode("utf-8")) for i, _, v in parts])
    store.repoint([
        (i, h, reference.of(v, *place, caller_from_prefix(v)) if indexing else v)
        for (i, h, v), place in zip(parts, places, strict=True) if is_reference(h)
    ])  # fmt: skip
    return len(parts)


def mark(settings: Settings, client: RedisClient, layout: Layout) -> None:
    """Mark the store filled for the namespace: its record, then Redis's mark."""
    outbox = Outbox(clients.new_producer(settings), settings.delivery_timeout + 1.0)
    try:
        StoreTopic(settings.store_topic, outbox, Metrics()).write(
            [filled_record(settings.store_topic, settings.namespace, now_ms())]
        )
    finally:
        outbox.close()
    client.set(layout.store_filled, settings.store_topic)
    log.info("store_marked_filled", topic=settings.store_topic, namespace=settings.namespace)


def _pending_ids(store: RedisStore) -> list[list[str]]:
    """Every pending id (due or in flight), in parts of FILL_PART."""
    ids: list[str] = []
    for keys in store.layout.shards:
        for key in (keys.due, keys.in_flight):
            members: list[bytes] = store.client.zrange(key, 0, -1)  # type: ignore[assignment]
            ids += [m.decode("utf-8") for m in members]
    return [ids[i : i + FILL_PART] for i in range(0, len(ids), FILL_PART)]

"""A consumer whose failures come back later: each record of TOPIC is processed, and one
that fails is handed to blackbox, which delivers it to TOPIC again after 1 s, then 5 s, then
30 s, and to TOPIC.dlq after its fourth failure. Runs for SECONDS (default 10).

KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 python retry_consumer.py TOPIC [SECONDS]
"""

import os
import sys
import time

from confluent_kafka import Consumer, Message

from blackbox.client import Client

bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
intake = os.environ.get("BLACKBOX_INTAKE_TOPIC", "blackbox")
topic, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
POLICY = {"delays": [1, 5, 30]}  # or the name of a policy in blackbox's policy file


def process(record: Message) -> None:
    """Your work. Here it fails each record's first attempt, to show a retry."""
    attempt = int(dict(record.headers() or []).get("blackbox-retry-attempt", b"1"))
    if attempt == 1:
        raise TimeoutError("the inventory service did not answer")


consumer = Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": "orders-worker",
        "enable.auto.commit": False,  # commit only once the retries are acknowledged
        "auto.offset.reset": "earliest",
    }
)
consumer.subscribe([topic])
client = Client({"bootstrap.servers": bootstrap}, caller="orders-worker", intake_topic=intake)
until = time.monotonic() + seconds
while time.monotonic() < until:
    records = [r for r in consumer.consume(100, timeout=0.5) if r.error() is None]
    for record in records:
        where = f"{record.topic()}/{record.partition()}/{record.offset()}"
        try:
            process(record)
            print(f"processed {where} ok", flush=True)
        except Exception as error:  # any failure is retried
            client.retry(record, error, policy=POLICY)  # value, key, headers as they came
            print(f"processed {where} failed: {error}", flush=True)
    if records:
        client.flush()  # the retries are acknowledged (SendFailed if not) ...
        consumer.commit(asynchronous=False)  # ... before the offsets move past them
consumer.close()

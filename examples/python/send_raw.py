"""Schedule a message with any Kafka producer (confluent-kafka here): the envelope is JSON.

KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 python send_raw.py TOPIC
"""

import json
import os
import sys

from confluent_kafka import Producer

bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
intake = os.environ.get("BLACKBOX_INTAKE_TOPIC", "blackbox")
topic = sys.argv[1]

producer = Producer(
    {
        "bootstrap.servers": bootstrap,
        "partitioner": "murmur2_random",  # as Java partitions keys; librdkafka's default differs
        "enable.idempotence": True,  # a retried produce is not a second schedule
    }
)
envelope = {"topic": topic, "message": {"invoice": 43}, "countdown": 2, "id": "invoice-43"}
producer.produce(
    intake,
    key=envelope["id"],  # keyed by the id: a later cancel lands on the same partition
    value=json.dumps(envelope),
    headers=[("CALLER_SERVICE", b"billing")],
)
if producer.flush(30) != 0:
    sys.exit("the broker did not acknowledge the schedule")

"""Schedule a message with blackbox's Python client: delivered to TOPIC in 2 seconds.

KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 python send_later.py TOPIC
"""

import os
import sys

from blackbox.client import Client

bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
intake = os.environ.get("BLACKBOX_INTAKE_TOPIC", "blackbox")
topic = sys.argv[1]

# The client keys each record by its id, partitions as Java does and produces idempotently.
with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=intake) as client:
    client.send_later(topic, {"invoice": 42}, delay=2, id="invoice-42", key="42")
# Leaving the block waits for the broker's acknowledgements (SendFailed if refused).

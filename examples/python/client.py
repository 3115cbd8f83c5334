"""blackbox's Python client: schedule, schedule bytes at an instant, cancel.

KAFKA_BOOTSTRAP_SERVERS=kafka:9092 python client.py
"""

import os
from datetime import UTC, datetime

from blackbox.client import Client

bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
intake = os.environ.get("BLACKBOX_INTAKE_TOPIC", "blackbox")

with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=intake) as client:
    client.send_later("invoices", {"invoice": 42}, delay=3600, id="invoice-42", key="42")
    client.send_later("invoices", b"\x00raw bytes", at=datetime(2030, 1, 1, tzinfo=UTC))
    client.cancel("invoice-42")
# leaving the block waits for the broker's acknowledgements (SendFailed if refused)

"""Helpers shared by the store-topic attack tests (test_store_attack_*.py)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from blackbox.envelope import CALLER_HEADER
from blackbox.service import Service
from tests.integration.test_store_topic import redis_pending, store_latest
from tests.kafkatools import produce

CALLER = "shop"


def send(env: dict[str, str], *documents: dict[str, Any], caller: str = CALLER) -> None:
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"],
            [orjson.dumps(d) for d in documents], [(CALLER_HEADER, caller.encode())])  # fmt: skip


def sid(name: str, caller: str = CALLER) -> str:
    return f"@{caller}/{name}"


def differences(service: Service, env: dict[str, str]) -> dict[str, tuple[Any, Any]]:
    """Each id where the store's latest live record and Redis's pending payload differ:
    id -> (store, redis) (None: a tombstone or nothing; "absent": no record at all)."""
    latest = store_latest(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_STORE_TOPIC"])
    pending = redis_pending(service)
    found: dict[str, tuple[Any, Any]] = {}
    for key in set(latest) | set(pending):
        live = latest.get(key, "absent")
        if live is None and key not in pending:
            continue
        if live != pending.get(key):
            found[key] = (live, pending.get(key))
    return found


def settled_differences(
    service: Service, env: dict[str, str], timeout: float = 10.0
) -> dict[str, tuple[Any, Any]]:
    """`differences` once they are gone, or as they stand after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        found = differences(service, env)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.3)  # the poll of a wait with a deadline

"""A rebuild on a broker that will not let blackbox describe a topic an intake record names
(an ACL; a hostile record naming a topic blackbox was never given): what was delivered there
cannot be told, so its schedules are passed over and counted, and the rebuild goes on with
the others (issue 50: one such record stopped every rebuild)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.intake import rebuild
from blackbox.intake.passover import Reason
from blackbox.kafka import clients
from blackbox.service import Service
from blackbox.settings import Settings
from tests.integration.conftest import service_env, wipe_namespace
from tests.kafkatools import envelope, produce, unique, wait_until

# Authorization on, every resource open but those an ACL names (so the broker's own
# requests, made as the same anonymous principal, go on as before).
GUARDED = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}


@pytest.fixture(scope="module")
def guarded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(free_port(), tmp_path_factory.mktemp("kafka-acls"), config=GUARDED)
    broker.start()
    yield broker
    broker.stop()


def _deny_describe(bootstrap: str, topic: str) -> None:
    """An ACL refusing every anonymous client (blackbox among them) Describe on `topic`."""
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                         "User:ANONYMOUS", "*", AclOperation.DESCRIBE,
                         AclPermissionType.DENY)  # fmt: skip
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until its answer came
    for future in admin.create_acls([binding]).values():
        future.result(30)


def test_a_target_blackbox_may_not_describe_is_passed_over_not_a_stop(
    guarded_broker: KafkaBroker, redis_server: RedisServer, tmp_path: Path
) -> None:
    env = service_env(redis_server.url, guarded_broker.bootstrap)
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, settings.own_topics)
    target, secret = unique("open"), unique("secret")
    _deny_describe(guarded_broker.bootstrap, secret)
    service = Service(settings)
    service.start()
    try:
        values = [envelope(target, f"kept-{n}", 600) for n in range(3)]
        produce(guarded_broker.bootstrap, settings.intake_topic,
                [*values, envelope(secret, "hidden", 600)])  # fmt: skip
        wait_until(lambda: sum(service.store.counts()) == 4, 60, "4 schedules stored")
    finally:
        service.stop()
    with redis.Redis.from_url(redis_server.url) as client:
        wipe_namespace(client, settings.namespace)

    counts = rebuild.rebuild(settings)
    assert counts.passed_over[Reason.TARGET_UNREADABLE] == 1
    assert counts.written == 3

"""Attack: the store topic given as another of blackbox's own topics, or as a target. The
settings must refuse it naming BLACKBOX_STORE_TOPIC; a request aimed at it is refused."""

from __future__ import annotations

import orjson
import pytest

from blackbox.errors import SettingsError
from blackbox.settings import Settings
from tests.integration.conftest import ReaderFactory, ServiceFactory, with_store_topic
from tests.integration.store_attack_tools import send
from tests.integration.test_store_topic import store_latest


@pytest.mark.parametrize("other", ["BLACKBOX_INTAKE_TOPIC", "BLACKBOX_DLQ_TOPIC",
                                   "BLACKBOX_EVENTS_TOPIC"])  # fmt: skip
def test_a_store_topic_shared_with_another_own_topic_is_refused_by_name(
    env: dict[str, str], other: str
) -> None:
    with pytest.raises(SettingsError, match="BLACKBOX_STORE_TOPIC"):
        Settings.from_env({**env, "BLACKBOX_STORE_TOPIC": env[other]})


def test_a_request_aimed_at_the_store_topic_is_dead_lettered_and_never_written_there(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    env = with_store_topic(env)
    start_service(BLACKBOX_STORE_TOPIC=env["BLACKBOX_STORE_TOPIC"])
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])
    send(env, {"id": "forge", "topic": env["BLACKBOX_STORE_TOPIC"], "message": "x",
               "countdown": 0})  # fmt: skip
    answer = orjson.loads(events.wait_count(1)[0].value or b"")
    assert answer["outcome"] == "dead_lettered", answer
    latest = store_latest(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_STORE_TOPIC"])
    assert all(v is None for v in latest.values()), latest

"""What `blackbox dev` starts, and how it refuses a port in use (no server is started)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from blackbox.dev import maven
from blackbox.dev import stack as stack_module
from blackbox.dev.servers import KafkaBroker, RedisServer, TansuBroker, cluster_id, free_port
from blackbox.dev.stack import DevOptions, DevStack, state_root
from blackbox.errors import StackError


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_kafka_and_redis_keep_their_data_together_in_the_state_folder(tmp_path: Path) -> None:
    """Both are kept or neither: Redis append-only beside Kafka's log folder."""
    stack = DevStack(DevOptions(state_dir=tmp_path / "s"), environ={})
    redis, broker = stack.servers

    assert isinstance(redis, RedisServer) and redis.appendfsync == "everysec"
    assert redis.data_dir == tmp_path / "s" / "redis"
    assert isinstance(broker, KafkaBroker) and broker.data_dir == tmp_path / "s" / "kafka"
    assert (broker.port, broker.controller_port) == (9092, 9093)


def test_fresh_deletes_the_kept_state(tmp_path: Path) -> None:
    """--fresh starts empty: the old topics and schedules are gone together."""
    (tmp_path / "s" / "kafka").mkdir(parents=True)
    (tmp_path / "s" / "kafka" / "meta.properties").write_text("old")

    DevStack(DevOptions(state_dir=tmp_path / "s", fresh=True), environ={})

    assert not (tmp_path / "s" / "kafka" / "meta.properties").exists()


def test_tansu_keeps_nothing_so_redis_keeps_nothing(tmp_path: Path) -> None:
    """Tansu loses its topics at a stop: a kept Redis watermark would skip new records."""
    stack = DevStack(DevOptions(broker="tansu", state_dir=tmp_path / "s"), environ={})
    redis, broker = stack.servers

    assert isinstance(broker, TansuBroker)
    assert isinstance(redis, RedisServer) and redis.appendfsync is None
    assert not (tmp_path / "s").exists()


def test_addresses_in_the_environment_are_used_and_nothing_is_started(tmp_path: Path) -> None:
    """KAFKA_BOOTSTRAP_SERVERS names an existing Kafka: no broker of ours is started."""
    environ = {"KAFKA_BOOTSTRAP_SERVERS": "kafka.example:9092"}
    stack = DevStack(DevOptions(state_dir=tmp_path), environ=environ)

    assert [type(s) for s in stack.servers] == [RedisServer]
    assert stack.environment()["KAFKA_BOOTSTRAP_SERVERS"] == "kafka.example:9092"
    assert stack.environment()["REDIS_URL"] == "redis://127.0.0.1:6379/0"


def test_dev_serves_the_open_api_on_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    """`blackbox dev` opens every API call without a token (guarantee 4: so it binds
    127.0.0.1, and the open API answers only local Host names); BLACKBOX_HTTP_HOST and
    BLACKBOX_API_DEV_OPEN in the environment override it."""
    local = DevStack(DevOptions(state_dir=tmp_path), environ={}).environment()
    assert (local["BLACKBOX_HTTP_HOST"], local["BLACKBOX_API_DEV_OPEN"]) == ("127.0.0.1", "true")
    told = {"BLACKBOX_HTTP_HOST": "0.0.0.0", "BLACKBOX_API_DEV_OPEN": "false"}  # noqa: S104
    assert DevStack(DevOptions(state_dir=tmp_path), environ=told).environment().items() >= (
        told.items()
    )


def test_state_folder_follows_xdg_state_home() -> None:
    """The kept state lives where the user's state belongs, never in the repository."""
    assert state_root({"XDG_STATE_HOME": "/srv/state"}) == Path("/srv/state/blackbox/dev")


def test_a_port_in_use_is_one_clear_error_naming_the_way_out(
    tmp_path: Path, taken_port: int
) -> None:
    """Nothing is started when a port is taken, and the message says what to do."""
    stack = DevStack(DevOptions(kafka_port=taken_port, redis_port=free_port(),
                                state_dir=tmp_path), environ={})  # fmt: skip

    with pytest.raises(StackError, match=f"port {taken_port} is in use") as caught:
        stack.start()

    assert "KAFKA_BOOTSTRAP_SERVERS" in str(caught.value)
    assert "--broker tansu" in str(caught.value)
    assert all(s.process is None for s in stack.servers)


def test_a_redis_port_in_use_names_redis_url(tmp_path: Path, taken_port: int) -> None:
    """A Redis already listening is named with the variable that would use it."""
    stack = DevStack(DevOptions(redis_port=taken_port, state_dir=tmp_path), environ={})

    with pytest.raises(StackError, match=f"REDIS_URL=redis://127.0.0.1:{taken_port}/0"):
        stack.start()


def test_cluster_ids_never_start_with_a_dash() -> None:
    """kafka-storage format reads `-t -abc…` as an option: one id in 64 would fail."""
    ids = [cluster_id() for _ in range(2000)]

    assert not any(i.startswith("-") for i in ids)
    assert all(len(i) == 22 for i in ids)
    assert len(set(ids)) == 2000


def test_each_server_is_said_to_start_and_to_have_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run` is never silent while a server starts: an event before and after each,
    naming it (Kafka's first start fetches its jars and takes a while)."""
    stack = DevStack(DevOptions(broker="tansu", state_dir=tmp_path / "s"), environ={})
    for server in stack.servers:
        monkeypatch.setattr(server, "start", lambda: None)
    monkeypatch.setattr(stack_module, "_refuse_taken_ports", lambda _server: None)
    with capture_logs() as logs:
        stack.start()
    said = [(e["event"].removeprefix("local_server_"), e["server"]) for e in logs]
    assert said == [("starting", "redis"), ("started", "redis"), ("starting", "tansu"),
                    ("started", "tansu")]  # fmt: skip


def test_a_jar_fetch_is_said_before_it_starts_and_once_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first start's minute of fetching from Maven Central is announced, then counted;
    a later start, from the cache, fetches and says nothing."""

    def fetched(_mvn: str, work: Path) -> None:
        (work / "jars").mkdir()
        (work / "jars" / "kafka.jar").write_bytes(b"")

    monkeypatch.setattr("blackbox.dev.maven.shutil.which", lambda _name: "mvn")
    monkeypatch.setattr(maven, "_run_maven", fetched)
    with capture_logs() as logs:
        folder = maven.classpath("kafka", ["g:a:1"], root=tmp_path)
        assert maven.classpath("kafka", ["g:a:1"], root=tmp_path) == folder
    assert [e["event"] for e in logs] == ["jars_fetching", "jars_fetched"]
    assert (logs[0]["source"], logs[1]["jars"]) == ("Maven Central", 1)

"""`start_on_free_ports`: a server whose picked port another process took before it bound
it is started again on other free ports, in a folder of its own (an hour of benchmarks lost
its second round to this once); any other failure to start is raised at once."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from benchmarks import stack
from blackbox.dev.servers import (
    LOOPBACK,
    RedisServer,
    free_port,
    start_on_free_ports,
    wait_for_metadata,
)
from blackbox.errors import StackError


@pytest.fixture
def held() -> Iterator[tuple[int, Iterator[int]]]:
    """A port bound, not listening (a server's bind fails on it), and picks that give it
    first, then free ports."""
    with socket.socket() as holder:
        holder.bind((LOOPBACK, 0))
        taken = holder.getsockname()[1]
        yield taken, itertools.chain([taken], iter(free_port, None))


def test_a_broker_whose_port_was_taken_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: tuple[int, Iterator[int]]
) -> None:
    taken, picks = held
    monkeypatch.setattr(stack, "free_port", lambda: next(picks))
    broker = start_on_free_ports(tmp_path, stack.kafka_broker)
    try:
        assert broker.port != taken
        wait_for_metadata(broker.bootstrap, 30)
        assert broker.data_dir.parent == tmp_path / "attempt-2"  # formatted anew, apart
    finally:
        broker.stop()


def test_a_redis_whose_port_was_taken_starts_on_another(
    tmp_path: Path, held: tuple[int, Iterator[int]]
) -> None:
    taken, picks = held
    server = start_on_free_ports(tmp_path, lambda folder: RedisServer(next(picks), folder))
    try:
        assert server.port != taken
        assert server.data_dir == tmp_path / "attempt-2"
        assert "Address already in use" in (tmp_path / "redis.log").read_text()
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.close()
    finally:
        server.stop()


def test_a_server_that_fails_for_another_reason_is_not_started_again(tmp_path: Path) -> None:
    """A failure that is not a taken port (here a directive redis-server refuses) would
    fail again: it is raised as it is, from the first folder, with the server's log."""
    made: list[RedisServer] = []

    def refused(folder: Path) -> RedisServer:
        made.append(RedisServer(free_port(), folder, config={"no-such-directive": "1"}))
        return made[-1]

    with pytest.raises(StackError, match="no-such-directive"):
        start_on_free_ports(tmp_path, refused)
    assert len(made) == 1
    assert not (tmp_path / "attempt-2").exists()

"""benchmarks.stack.start_broker: a broker whose picked port another process took before
the JVM bound it is started again on other free ports (an hour of benchmarks lost its
second round to this once)."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from benchmarks import stack
from blackbox.dev.servers import LOOPBACK, free_port, wait_for_metadata


def test_a_broker_whose_port_was_taken_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as holder:  # bound, not listening: the JVM's bind fails
        holder.bind((LOOPBACK, 0))
        taken = holder.getsockname()[1]
        picks = itertools.chain([taken], iter(free_port, None))
        monkeypatch.setattr(stack, "free_port", lambda: next(picks))
        broker = stack.start_broker(tmp_path, stack.kafka_broker)
        try:
            assert broker.port != taken
            wait_for_metadata(broker.bootstrap, 30)
            assert (tmp_path / "broker-2").is_dir()  # formatted anew, in a folder of its own
        finally:
            broker.stop()

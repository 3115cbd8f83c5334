"""The Dockerfile's promises that hold without building it (no container engine needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from blackbox.api.app import probes_app
from blackbox.api.server import Endpoints
from blackbox.health import Health
from blackbox.metrics import Metrics
from tests.deploy.chart import ROOT, default_values

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instruction(name: str) -> str:
    """The last instruction of this name, continuation lines joined."""
    text = DOCKERFILE.replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith(name + " ")]
    return lines[-1].removeprefix(name + " ").strip()


@pytest.fixture
def health_server() -> Iterator[tuple[Endpoints, Health]]:
    metrics = Metrics()
    health = Health({}, metrics)
    server = Endpoints("127.0.0.1", 0, probes_app(health, metrics))
    server.start()
    yield server, health
    server.stop()


def _healthcheck(port: int) -> int:
    command = json.loads(_instruction("HEALTHCHECK").split(" CMD ", 1)[1])
    assert command[0] == "python"
    env = {**os.environ, "BLACKBOX_HTTP_PORT": str(port)}
    return subprocess.run([sys.executable, *command[1:]], env=env, check=False).returncode


def test_healthcheck_passes_while_live_and_fails_when_not(
    health_server: tuple[Endpoints, Health],
) -> None:
    """The image's HEALTHCHECK asks the real /live on BLACKBOX_HTTP_PORT: it succeeds while
    the service is live and fails once a worker thread has crashed."""
    server, health = health_server
    assert _healthcheck(server.port) == 0
    health.mark_crashed()
    assert _healthcheck(server.port) != 0


def test_runs_as_the_charts_non_root_user() -> None:
    """The image's user is the unprivileged uid the chart's pod security context names."""
    user, group = _instruction("USER").split(":")
    pod = default_values()["podSecurityContext"]
    assert (int(user), int(group)) == (pod["runAsUser"], pod["runAsGroup"])
    assert int(user) != 0


def test_entry_point_is_blackbox_run() -> None:
    """`docker run IMAGE` runs the service; `docker run IMAGE send ...` any other command."""
    assert json.loads(_instruction("ENTRYPOINT")) == ["blackbox"]
    assert json.loads(_instruction("CMD")) == ["run"]

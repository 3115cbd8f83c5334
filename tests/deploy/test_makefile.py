"""`make run` on a fresh clone says what it is doing: each step is announced before it runs,
and the long ones show their progress. The Makefile's own recipes run here, in a copy of
the clone, with stand-ins for apt-get, Python, pip, dpkg-deb and the service: nothing is
installed and nothing is fetched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.chart import ROOT

# What the recipes call besides the stand-ins, linked from the machine: PATH holds nothing
# else, so the system packages the Makefile looks for are missing (Go aside, when it sits
# in /usr/local/go, where the Makefile also looks).
HOST_TOOLS = ("rm", "mkdir", "touch", "chmod", "mv", "tar", "cat")
STAND_INS = {
    # `python3 -m venv DIR`: a venv whose pip and blackbox say how they were called.
    "python3": 'mkdir -p "$3/bin"\nfor tool in pip blackbox; do\n'
    '  printf \'#!/bin/sh\\necho "%s $*"\\n\' "$tool" > "$3/bin/$tool"\n'
    '  chmod +x "$3/bin/$tool"\ndone',
    "apt-get": 'echo "apt-get $*"\n[ "$1" = download ] && touch prometheus_1_amd64.deb\nexit 0',
}
# What `make run` starts, on the defaults: the README's ports, the data in the clone.
DEV_DEFAULTS = "blackbox dev --redis-port 6379 --kafka-port 9092 --state-dir .dev"
# `dpkg-deb --fsys-tarfile DEB`: a package holding only ./usr/bin/promtool, under this folder.
UNPACK = 'cd "{}" && tar -cf - ./usr/bin/promtool'


def _stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def fresh_clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone with no venv, and the environment `make` runs in there."""
    clone, tools = tmp_path / "clone", tmp_path / "tools"
    clone.mkdir()
    tools.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, clone / name)
    for name in HOST_TOOLS:
        found = shutil.which(name)
        assert found is not None, name
        (tools / name).symlink_to(found)
    for name, body in STAND_INS.items():
        _stand_in(tools, name, body)
    (tools / "deb" / "usr" / "bin").mkdir(parents=True)
    _stand_in(tools / "deb" / "usr" / "bin", "promtool", "exit 0")
    _stand_in(tools, "dpkg-deb", UNPACK.format(tools / "deb"))
    return clone, {"PATH": str(tools), "HOME": str(tmp_path)}


def _make(clone: Path, env: dict[str, str], target: str, *variables: str) -> list[str]:
    make = shutil.which("make")
    assert make is not None, "make is the README's first command"
    done = subprocess.run([make, "--no-print-directory", target, *variables], cwd=clone,
                          env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_make_run_announces_each_step_before_it_runs(
    fresh_clone: tuple[Path, dict[str, str]],
) -> None:
    """On a fresh clone, `make run` names each step before its tool speaks: the missing
    system packages apt-get installs (with its per-package lines), the venv pip fills
    (without -q, so a line per package), promtool, and what `blackbox dev` starts."""
    clone, env = fresh_clone
    lines = _make(clone, env, "run")
    steps = [line for line in lines if line.startswith("==> ")]
    assert len(steps) == 5, lines
    packages, python, ready, promtool, service = steps
    for wanted in ("redis-server", "kcat", "chromium", "maven", "apt-get"):
        assert wanted in packages, packages
    assert "PyPI" in python and ".venv" in python and ".venv is ready" in ready
    assert "promtool" in promtool
    assert "Redis" in service and "Apache Kafka" in service and "Maven Central" in service
    calls = [line for line in lines if not line.startswith("==> ")]
    install = next(c for c in calls if c.startswith("apt-get install"))
    assert " -q " in install and " -qq " not in install, install
    pip = next(c for c in calls if c.startswith("pip install -e"))
    assert "-q" not in pip.split(), pip
    order = [packages, install, python, pip, ready, promtool, service, DEV_DEFAULTS]
    assert [lines.index(line) for line in order] == sorted(lines.index(line) for line in order)
    assert os.access(clone / ".venv" / "bin" / "promtool", os.X_OK)


def test_a_second_make_run_says_only_what_it_does(
    fresh_clone: tuple[Path, dict[str, str]],
) -> None:
    """Once set up, `make run` says the system packages are there and starts the stack;
    it installs nothing."""
    clone, env = fresh_clone
    _make(clone, env, "setup")
    for name in ("redis-server", "redis-cli", "java", "mvn", "kcat", "chromium", "go"):
        _stand_in(Path(env["PATH"]), name, "exit 0")
    lines = _make(clone, env, "run")
    assert [line for line in lines if line.startswith("==> ")] == [
        "==> system packages: Redis, Java, Maven, kcat, Chromium and Go are here",
        "==> blackbox dev: Redis, Apache Kafka (its jars from Maven Central the first time), "
        "then the service; Ctrl-C stops all",
    ]
    assert DEV_DEFAULTS in lines


def test_make_run_passes_the_ports_and_keeps_the_data_in_the_clone(
    fresh_clone: tuple[Path, dict[str, str]],
) -> None:
    """`make run REDIS_PORT=... KAFKA_PORT=...` starts the stack on those ports; its data
    sits in the clone's .dev, which `make clean` removes with the venv."""
    clone, env = fresh_clone
    lines = _make(clone, env, "run", "REDIS_PORT=6390", "KAFKA_PORT=9190")
    assert "blackbox dev --redis-port 6390 --kafka-port 9190 --state-dir .dev" in lines, lines
    (clone / ".dev" / "redis").mkdir(parents=True)  # as `blackbox dev` leaves it
    _make(clone, env, "clean")
    assert not (clone / ".dev").exists()
    assert not (clone / ".venv").exists()

"""The package as users install it (guarantee 9): the Dockerfile's build stage, run here on
this checkout (no container engine needed), builds the wheel and installs it, not editable,
in a fresh venv with its runtime dependencies only; the installed `blackbox` then starts
against a real Redis and Apache Kafka and delivers a message.

The build stage's own RUN lines are what runs, its paths moved under a temporary folder, so
the image and this test cannot install the package two different ways.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx
import orjson
import pytest

from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from tests.deploy.chart import ROOT
from tests.integration import conftest as stack
from tests.integration.conftest import service_env
from tests.kafkatools import TopicReader, unique, wait_until
from tests.otlp import Collector
from tests.process import BlackboxProcess

# A cold pip cache downloads every runtime dependency once: more than the default timeout.
pytestmark = pytest.mark.timeout(600)

broker = stack.broker  # the integration tests' Apache Kafka and Redis fixtures
redis_server = stack.redis_server

# Speed only: pip's cache changes how fast the dependencies come, not which are installed.
SKIPPED_ENV = frozenset({"PIP_NO_CACHE_DIR"})
# Not from the test's environment: nothing of the checkout or its venv may leak in.
UNSET_ENV = frozenset({"PYTHONPATH", "VIRTUAL_ENV", *SKIPPED_ENV})
# An absolute path in the build stage (the venv, the wheel folder, the work folder).
IMAGE_PATH = re.compile(r"(?<![\w.])/[\w.*/-]*")


def _build_stage() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile's first stage, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    parsed = [line.split(" ", 1) for line in lines if line and not line.startswith("#")]
    starts = [i for i, (name, _) in enumerate(parsed) if name == "FROM"]
    assert len(starts) >= 2, "a build stage, then the final image"
    return [(name, rest) for name, rest in parsed[starts[0] + 1 : starts[1]]]


class BuildStage:
    """The build stage's ARG, COPY, WORKDIR, ENV and RUN, run on this machine with every
    path of the image moved under `root` (/opt/blackbox becomes root/opt/blackbox);
    `build_args` as `docker build --build-arg` gives them."""

    def __init__(self, root: Path, build_args: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.workdir = root
        self.env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
        self.build_args = dict(build_args or {})

    def run(self) -> None:
        steps = {"ARG": self._arg, "COPY": self._copy, "WORKDIR": self._workdir,
                 "ENV": self._env, "RUN": self._run}  # fmt: skip
        for instruction, arguments in _build_stage():
            if instruction not in steps:
                pytest.fail(f"the Dockerfile's build stage uses {instruction}: teach this test")
            steps[instruction](arguments)

    def path(self, image_path: str) -> Path:
        """Where a path of the image is here."""
        return self.root / image_path.lstrip("/")

    def _workdir(self, arguments: str) -> None:
        self.workdir = self.path(arguments)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _copy(self, arguments: str) -> None:
        *sources, target = arguments.split()
        folder = self.workdir / target
        for source in sources:
            path = ROOT / source
            if path.is_dir():  # .dockerignore keeps bytecode out of the context
                shutil.copytree(path, folder, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, folder / path.name)

    def _arg(self, arguments: str) -> None:
        """A build argument: the one given, else its default (quotes as the shell reads)."""
        name, _, default = arguments.partition("=")
        self.env[name] = self.build_args.get(name, default.strip('"'))

    def _env(self, arguments: str) -> None:
        for pair in arguments.split():
            name, _, value = pair.partition("=")
            if name not in SKIPPED_ENV:
                self.env[name] = value

    def _run(self, arguments: str) -> None:
        moved = IMAGE_PATH.sub(lambda m: str(self.path(m.group())), arguments)
        # The image's `python` is its only interpreter; here, the one running the tests.
        command = re.sub(r"^python ", f"{sys.executable} ", moved)
        subprocess.run(["/bin/sh", "-c", command], cwd=self.workdir, env=self.env, check=True,
                       timeout=500)  # fmt: skip


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> BuildStage:
    """The build stage run once: its venv holds the installed package."""
    stage = BuildStage(tmp_path_factory.mktemp("image"))
    stage.run()
    return stage


@pytest.fixture(scope="module")
def otel_image(tmp_path_factory: pytest.TempPathFactory) -> BuildStage:
    """The build stage with `--build-arg BLACKBOX_EXTRAS=otel`: the image that exports spans."""
    stage = BuildStage(tmp_path_factory.mktemp("image-otel"), {"BLACKBOX_EXTRAS": "otel"})
    stage.run()
    return stage


def _venv(image: BuildStage) -> Path:
    """The venv the build stage installed into (the final image copies it whole)."""
    copied = next(a for i, a in _final_stage() if i == "COPY" and a.startswith("--from="))
    return image.path(copied.split()[-1])


def _final_stage() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    parsed = [line.split(" ", 1) for line in lines if not line.startswith("#")]
    last = max(i for i, (name, _) in enumerate(parsed) if name == "FROM")
    return [(name, rest) for name, rest in parsed[last + 1 :]]


def _blackbox(
    image: BuildStage, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed command, run outside the checkout as the image's entry point runs it."""
    command = [str(_venv(image) / "bin" / "blackbox"), *args]
    return subprocess.run(command, cwd=image.root, env={**image.env, **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def _files(package: Path) -> set[str]:
    """Every file of a blackbox folder, bytecode aside, by its path inside it."""
    found = (p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {str(p.relative_to(package)) for p in found}


def test_the_installed_package_is_the_whole_package(image: BuildStage) -> None:
    """Guarantee 9: the venv holds every file of the source tree's package (its packages
    found, not listed by hand: Python, Lua scripts, the admin page), imports blackbox from
    itself (not from this checkout), and `blackbox --help` runs."""
    python = _venv(image) / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import blackbox; print(blackbox.__file__)"],
                           cwd=image.root, env=image.env, capture_output=True, text=True,
                           check=True).stdout.strip()  # fmt: skip
    installed = Path(where).parent
    assert installed.is_relative_to(_venv(image)), where
    missing = _files(ROOT / "blackbox") - _files(installed)
    assert missing == set(), f"not installed: {sorted(missing)}"
    helped = _blackbox(image, "--help")
    assert helped.returncode == 0 and "run the service" in helped.stdout, helped.stderr


# Run by the installed interpreter: every Lua script through the loader the store uses, and
# the admin page through the API's own app (its folder is found when the app is built).
RESOURCES = """
from fastapi import FastAPI
from blackbox.api.app import _page_routes
from blackbox.storage import scripts
names = ["claim", "intake", "pending", "ack", "advance", "room", "shards", "incarnation"]
print(sum(len(scripts.source(name)) for name in names))
app = FastAPI()
_page_routes(app)  # its StaticFiles refuses a folder that is not there
index = next(r for r in app.routes if getattr(r, "path", "") == "/").endpoint()
print(index.body.decode().count("<html"))  # the page, its footer filled in
"""


def test_the_installed_package_finds_its_lua_scripts_and_page(image: BuildStage) -> None:
    """Guarantee 9: the regrouped package's resources (storage/lua/, api/page/) are read
    from the installed wheel by the code that reads them in the service."""
    python = _venv(image) / "bin" / "python"
    ran = subprocess.run([str(python), "-c", RESOURCES], cwd=image.root, env=image.env,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    lua_chars, pages = (int(line) for line in ran.stdout.split())
    assert lua_chars > 1_000 and pages == 1, ran.stdout


def test_spark_without_the_extra_says_how_to_install_it(image: BuildStage) -> None:
    """Guarantee 9: the image has no PySpark; `blackbox spark --help` still answers, and a
    Spark job says how to install the extra and exits 2, never with a traceback."""
    helped = _blackbox(image, "spark", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "schedule" in helped.stdout and "audit" in helped.stdout
    job = _blackbox(image, "spark", "audit", "--out", str(image.root / "audit"))
    assert job.returncode == 2, job.stderr
    assert "pip install 'blackbox[spark]'" in job.stderr
    assert "Traceback" not in job.stderr + job.stdout


def test_the_installed_service_starts_and_delivers(
    image: BuildStage,
    redis_server: RedisServer,
    broker: KafkaBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guarantee 9: the installed `blackbox run` answers /ready on a real Redis and Apache
    Kafka, and a message scheduled with the installed `blackbox send` is delivered once,
    with its blackbox-id, then the service stops cleanly on SIGTERM."""
    port, target = free_port(), unique("wheel")
    env = service_env(redis_server.url, broker.bootstrap, BLACKBOX_HTTP_PORT=str(port))
    for name in UNSET_ENV:  # the process inherits the test's environment
        monkeypatch.delenv(name, raising=False)
    service = _started(image, env, tmp_path / "run.log", port)
    reader = TopicReader(broker.bootstrap, target)
    try:
        sent = _blackbox(image, "send", "--topic", target, "--countdown", "0.5", "--id", "one",
                         "--caller", "wheel", '{"from": "the wheel"}', env=env)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        (record,) = reader.wait_count(1, timeout=60)
    finally:
        reader.close()
        code = service.terminate()
    assert orjson.loads(record.value or b"") == {"from": "the wheel"}
    assert record.header("blackbox-id") == "@wheel/one"
    assert code == 0, service.output()


def _started(image: BuildStage, env: dict[str, str], log: Path, port: int) -> BlackboxProcess:
    """The installed `blackbox run`, its topics made by the installed create-topics, once it
    answers /ready on `port`."""
    assert _blackbox(image, "create-topics", env=env).returncode == 0
    program = [str(_venv(image) / "bin" / "blackbox")]
    service = BlackboxProcess(env, log, "run", program=program)
    try:
        wait_until(lambda: _ready(port, service), timeout=90, what="the installed /ready")
    except BaseException:
        service.terminate()
        raise
    return service


def _ready(port: int, service: BlackboxProcess) -> bool:
    assert service.process.poll() is None, service.output()
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _imports(image: BuildStage, module: str) -> bool:
    python = _venv(image) / "bin" / "python"
    ran = subprocess.run([str(python), "-c", f"import {module}"], cwd=image.root, env=image.env,
                         capture_output=True, check=False)  # fmt: skip
    return ran.returncode == 0


def test_the_otel_variant_exports_spans_of_what_it_delivers(  # noqa: PLR0913, PLR0917 - fixtures
    image: BuildStage, otel_image: BuildStage, redis_server: RedisServer, broker: KafkaBroker,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Guarantee 9 for the image built with BLACKBOX_EXTRAS=otel (the default one has no
    OpenTelemetry SDK): the installed `blackbox run` with OTEL_* set delivers a message and
    exports its fire span to a real OTLP/HTTP endpoint."""
    assert not _imports(image, "opentelemetry.sdk") and _imports(otel_image, "opentelemetry.sdk")
    port, target, collector = free_port(), unique("otel-wheel"), Collector()
    env = service_env(redis_server.url, broker.bootstrap, BLACKBOX_HTTP_PORT=str(port),
                      OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
                      OTEL_BSP_SCHEDULE_DELAY="100")  # fmt: skip
    for name in UNSET_ENV:
        monkeypatch.delenv(name, raising=False)
    service = _started(otel_image, env, tmp_path / "run.log", port)
    reader = TopicReader(broker.bootstrap, target)
    try:
        sent = _blackbox(otel_image, "send", "--topic", target, "--countdown", "0.5",
                         "--caller", "wheel", '"traced"', env=env)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        reader.wait_count(1, timeout=60)
        wait_until(lambda: bool(collector.named(f"send {target}")), 30, "the fire span")
    finally:
        reader.close()
        code = service.terminate()
        collector.close()
    assert code == 0, service.output()

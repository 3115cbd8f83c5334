"""Java artifacts from Maven Central, fetched once with `mvn` into a cache of the user's.

The local Apache Kafka broker and Spark's Kafka connector are jars: a small generated POM
names the pinned artifacts, `mvn dependency:copy-dependencies` collects them with their
runtime dependencies, and the folder is reused by every later start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

import structlog

from blackbox.errors import StackError

log = structlog.get_logger("blackbox.dev.maven")

# The broker of the local stack, tests and benchmarks. Kafka 4.1 logs through log4j 2.24;
# the distribution adds the log4j jars itself, no POM of Kafka's declares them.
KAFKA_VERSION = "4.1.1"
_LOG4J_VERSION = "2.24.3"
KAFKA_BROKER = (
    f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
    f"org.apache.logging.log4j:log4j-slf4j-impl:{_LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-core:{_LOG4J_VERSION}",
    f"org.apache.logging.log4j:log4j-api:{_LOG4J_VERSION}",
)
_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
_DONE = ".complete"


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """BLACKBOX_CACHE_DIR, else $XDG_CACHE_HOME/blackbox, else ~/.cache/blackbox."""
    explicit = environ.get("BLACKBOX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "blackbox"


def classpath(name: str, artifacts: Sequence[str], root: Path | None = None) -> Path:
    """The folder holding `artifacts` and their runtime dependencies, fetched if missing."""
    digest = hashlib.sha256("\n".join(artifacts).encode()).hexdigest()[:12]
    folder = (root or cache_root()) / "jars" / f"{name}-{digest}"
    if not (folder / _DONE).exists():
        _fetch(artifacts, folder)
    return folder


def _fetch(artifacts: Sequence[str], folder: Path) -> None:
    """Fetch into a scratch folder, then move it in place: a half-done fetch is never used."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            "the local Apache Kafka broker needs Maven to fetch its jars: apt-get install maven "
            "(or run with --broker tansu, or set KAFKA_BOOTSTRAP_SERVERS to an existing Kafka)"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    # A first fetch takes a minute or so, with nothing else to show for it: say so.
    log.info("jars_fetching", source="Maven Central", artifacts=list(artifacts), into=str(folder))
    started = time.monotonic()
    try:
        (work / "pom.xml").write_text(pom(artifacts))
        _run_maven(mvn, work)
        jars = len(list((work / "jars").glob("*.jar")))
        (work / "jars" / _DONE).touch()
        _move_into_place(work / "jars", folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("jars_fetched", jars=jars, seconds=round(time.monotonic() - started, 1))


def _run_maven(mvn: str, work: Path) -> None:
    command = [mvn, "-q", "-B", "-f", str(work / "pom.xml"), _PLUGIN,
               f"-DoutputDirectory={work / 'jars'}", "-DincludeScope=runtime"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise StackError(
            f"mvn could not fetch the jars (exit {done.returncode}); is Maven Central "
            f"reachable? Or run with --broker tansu.\n{tail}"
        )


def _move_into_place(fetched: Path, folder: Path) -> None:
    try:
        fetched.rename(folder)
    except OSError:
        if not (folder / _DONE).exists():  # not another process finishing first
            raise


def pom(artifacts: Sequence[str]) -> str:
    """A POM whose dependencies are `artifacts` ("group:artifact:version" each)."""
    dependencies = "".join(_dependency(a) for a in artifacts)
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">'
        "<modelVersion>4.0.0</modelVersion><groupId>blackbox</groupId>"
        "<artifactId>jars</artifactId><version>1</version>"
        f"<dependencies>{dependencies}</dependencies></project>\n"
    )


def _dependency(coordinates: str) -> str:
    parts = coordinates.split(":")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{coordinates!r} is not group:artifact:version")
    group, artifact, version = (escape(p) for p in parts)
    return (
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
    )

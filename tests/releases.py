"""The release before this one, run beside it on one Redis and one Kafka (guarantee 11).

The previous release is a commit of main, extracted from git into a folder; `python -m
blackbox` started in that folder (and with it first on PYTHONPATH) imports that tree, not
the one the venv has installed. `Replica` runs `blackbox run` of either release with an
HTTP port of its own, so a test can wait for it to be ready and read its metrics."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from blackbox.dev.servers import free_port
from tests.process import BlackboxProcess

# Each release, as main was shipped; the release before this one first.
RELEASES = {
    "0.2.0": "a169e5e09c6d8b38a8d3275b3a65e96ba0e14aae",
    "0.1.0": "abc400b093a1be8befe2645af9021504688d1f4c",
}
PREVIOUS_RELEASE = RELEASES["0.2.0"]
REPOSITORY = Path(__file__).resolve().parent.parent


class ReleaseUnavailable(Exception):
    """This checkout cannot give the previous release's tree (no git, or a shallow clone)."""


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise ReleaseUnavailable("git is not installed: the previous release is read from git")
    return subprocess.run([git, "-C", str(REPOSITORY), *args], capture_output=True,
                          check=False, timeout=60)  # fmt: skip


def _check_commit(commit: str) -> None:
    """Raise ReleaseUnavailable where the clone cannot have `commit` (git missing, no clone,
    a shallow one); a full clone without it fails the test: main's history was rewritten."""
    checkout = _git("rev-parse", "--git-dir")
    if checkout.returncode != 0:
        why = checkout.stderr.decode(errors="replace").strip()
        raise ReleaseUnavailable(f"{REPOSITORY} is not a git clone ({why})")
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
        return
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true":
        raise ReleaseUnavailable(
            f"this clone is shallow and lacks the previous release {commit[:12]}: "
            "clone with full history (or `git fetch --unshallow`) to run the upgrade tests"
        )
    raise AssertionError(f"the previous release {commit} is missing from a full clone of main")


def extract(commit: str, into: Path) -> Path:
    """The tree of `commit`, extracted into `into` (as `git archive | tar -x` does)."""
    _check_commit(commit)
    archive = _git("archive", "--format=tar", commit)
    assert archive.returncode == 0, archive.stderr.decode(errors="replace")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    imported = imported_from(into)
    assert imported.is_relative_to(into), f"`import blackbox` in {into} took {imported}"
    return into


def release_env(tree: Path) -> dict[str, str]:
    """What makes `python -m blackbox` import `tree`: it comes first on the path (the
    working directory alone would do, unless PYTHONSAFEPATH is set)."""
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(tree), *([rest] if rest else [])])}


def imported_from(tree: Path) -> Path:
    """The file `import blackbox` loads when run in `tree` as a Replica runs it."""
    found = subprocess.run(
        [sys.executable, "-c", "import blackbox; print(blackbox.__file__)"],
        cwd=tree, env={**os.environ, **release_env(tree)}, capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    return Path(found.stdout.strip())


class Replica:
    """`blackbox run` of one release: the previous one's `tree`, or this one (None)."""

    def __init__(self, env: dict[str, str], log_path: Path, tree: Path | None = None) -> None:
        self.release = "previous" if tree is not None else "this"
        self.port = free_port()
        own = {**env, "BLACKBOX_HTTP_PORT": str(self.port), "PYTHONUNBUFFERED": "1"}
        if tree is not None:
            own.update(release_env(tree))
        self.process = BlackboxProcess(own, log_path, "run", cwd=tree)
        self.base = f"http://127.0.0.1:{self.port}"

    def __repr__(self) -> str:
        return f"Replica({self.release} release, pid {self.process.process.pid})"

    def ready(self) -> bool:
        """Whether /ready answers 200; an AssertionError naming the log if it exited."""
        code = self.process.process.poll()
        assert code is None, f"{self} exited with {code}:\n{self.process.output()[-3000:]}"
        try:
            return httpx.get(f"{self.base}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str, token: str) -> httpx.Response:
        """GET `path` of its HTTP API with the bearer `token`."""
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(f"{self.base}{path}", headers=headers, timeout=10)

    def metric(self, sample: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample of its /metrics; None when it has none (or does not answer yet)."""
        try:
            text = httpx.get(f"{self.base}/metrics", timeout=10).text
        except httpx.HTTPError:
            return None
        for family in text_string_to_metric_families(text):
            for found in family.samples:
                if found.name == sample and found.labels == (labels or {}):
                    return float(found.value)
        return None

    def freeze(self) -> None:
        """SIGSTOP: it holds whatever it claimed, as at the instant of a crash."""
        self.process.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.process.send_signal(signal.SIGCONT)

    def terminate(self) -> int:
        """SIGTERM, as Kubernetes stops a pod; the exit code."""
        return self.process.terminate(timeout=30)

    def kill(self) -> None:
        self.process.kill()

    def output(self) -> str:
        return self.process.output()

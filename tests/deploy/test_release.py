"""One release, one version (guarantee 11: the version is visible): pyproject.toml names it,
and what deploys it agrees: the chart's appVersion and default image tag, the image's label,
docker-compose's build, the docs' install lines and the changelog's top entry."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tests.deploy.chart import CHART, ROOT, container, manifests, of_kind

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
# A release's heading in CHANGELOG.md: "## 0.2.0 - 2026-11-26".
ENTRY = re.compile(r"^## (\S+) - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)
SECTIONS = ("### Added", "### Changed", "### Fixed", "### Upgrade notes")


def _version() -> str:
    declared: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return declared


def _changelog() -> list[tuple[str, str, str]]:
    """(version, date, text) of each entry, top first."""
    text = (ROOT / "CHANGELOG.md").read_text()
    found = list(ENTRY.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return [(m[1], m[2], text[m.end() : end]) for m, end in zip(found, ends, strict=True)]


def test_the_version_is_semantic() -> None:
    """pyproject.toml's version is MAJOR.MINOR.PATCH, as are the chart's."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for version in (_version(), chart["version"], chart["appVersion"]):
        assert SEMVER.match(version), version


def test_what_deploys_the_release_names_its_version() -> None:
    """The chart's appVersion, the image its Deployment runs by default, the version
    docker-compose builds with and the docs' `helm install` lines are pyproject's."""
    version = _version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (deployment,) = of_kind(manifests(), "Deployment")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    built = {s["build"]["args"]["BLACKBOX_VERSION"] for s in compose["services"].values()
             if "build" in s}  # fmt: skip
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    shown = {v for p in pages for v in re.findall(r"--set image\.tag=(\S+)", p.read_text())}
    assert chart["appVersion"] == version
    assert container(deployment)["image"] == f"blackbox:{version}"
    assert built == {version}
    assert shown == {version}


def test_the_changelog_tops_with_this_release() -> None:
    """CHANGELOG.md's entries run newest first, each a version and a date; the top one is
    this release, with what was added, changed and fixed and what an operator must do."""
    entries = _changelog()
    versions = [tuple(int(part) for part in v.split(".")) for v, _, _ in entries]
    dates = [date for _, date, _ in entries]
    assert entries[0][0] == _version()
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert dates == sorted(dates, reverse=True)
    positions = [entries[0][2].find(section) for section in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), positions


def _label_check() -> str:
    """The final stage's RUN that compares BLACKBOX_VERSION with the installed package."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    final = text.rsplit("\nFROM ", 1)[1]
    (check,) = [line[4:] for line in final.splitlines() if line.startswith("RUN installed=")]
    return check


def _check(version: str) -> subprocess.CompletedProcess[str]:
    """The image's check, run against this venv's installed `blackbox`."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "BLACKBOX_VERSION": version}
    return subprocess.run(["/bin/sh", "-c", _label_check()], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_the_image_is_labelled_with_the_version_it_installs() -> None:
    """The image's OCI version label is the BLACKBOX_VERSION build argument, and the build
    fails when that is not the installed package's version: with pyproject's the check
    passes; with another, or none, it fails and says what to pass."""
    final = (ROOT / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    assert 'org.opencontainers.image.version="${BLACKBOX_VERSION}"' in final
    assert _check(_version()).returncode == 0
    for wrong in ("9.9.9", ""):
        refused = _check(wrong)
        assert refused.returncode == 1
        assert "--build-arg BLACKBOX_VERSION=" in refused.stderr

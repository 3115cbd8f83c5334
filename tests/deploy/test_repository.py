"""The repository clones whole on every file system: no two tracked paths differ only by
case (on macOS's and Windows's case-insensitive file systems one would replace the other, as
docs/PERFORMANCE.md did docs/performance.md)."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict

import pytest

from tests.deploy.chart import ROOT


def _tracked_paths() -> list[str]:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist has no tracked paths)")
    listed = subprocess.run([git, "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True)  # fmt: skip
    return [p for p in listed.stdout.decode().split("\0") if p]


def case_collisions(paths: list[str]) -> list[list[str]]:
    """The groups of paths (and of their folders) that are one path on a case-insensitive
    file system."""
    names = {folder for path in paths for folder in _folders(path)} | set(paths)
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names):
        groups[name.casefold()].append(name)
    return [group for group in groups.values() if len(group) > 1]


def _folders(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def test_case_collisions_are_found() -> None:
    """The check sees two files, or a file and a folder's files, that only case tells apart."""
    assert case_collisions(["docs/a.md", "docs/A.md", "b.md"]) == [["docs/A.md", "docs/a.md"]]
    assert case_collisions(["Docs/x.md", "docs/y.md"]) == [["Docs", "docs"]]
    assert case_collisions(["docs/a.md", "docs/b.md"]) == []


def test_no_two_tracked_paths_differ_only_by_case() -> None:
    """Every tracked path stays distinct on a case-insensitive file system."""
    assert case_collisions(_tracked_paths()) == []

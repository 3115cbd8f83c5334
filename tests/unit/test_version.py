"""The release is named once, in pyproject.toml, and told by the command, the metrics and
the package (guarantee 11: the version is visible)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import blackbox
from blackbox.cli import main as cli
from blackbox.metrics import Metrics
from blackbox.version import version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _declared() -> str:
    declared: str = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    return declared


def test_blackbox_version_prints_the_release_of_pyproject(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`blackbox --version` prints pyproject.toml's version, read from the installed package's
    metadata (a venv installed before a version change says so here), and exits 0."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"blackbox {_declared()}\n"


def test_metrics_carry_the_release_as_build_info() -> None:
    """Each service's registry has blackbox_build_info{version} = 1, nothing else labelled."""
    metrics = Metrics()
    assert metrics.value("blackbox_build_info", {"version": version()}) == 1
    (family,) = [f for f in metrics.registry.collect() if f.name == "blackbox_build_info"]
    assert [sample.labels for sample in family.samples] == [{"version": version()}]


def test_the_package_tells_the_same_version() -> None:
    """`blackbox.__version__` is the installed release, not a copy kept by hand."""
    assert blackbox.__version__ == version() == _declared()

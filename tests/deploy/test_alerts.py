"""The alert rules under Prometheus's own tool: valid, and each fires on its trouble only.

promtool (from Debian's prometheus package; `make setup` puts it beside the virtualenv's
Python) evaluates alerts_test.yml: synthetic series for each failure, and the time each
alert must, or must not, have fired by.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.deploy.chart import ROOT

HERE = Path(__file__).resolve().parent


def _promtool() -> Path:
    beside = Path(sys.executable).with_name("promtool")
    found = beside if beside.exists() else shutil.which("promtool")
    assert found, "promtool is missing: `make setup` installs it"
    return Path(found)


def _promtool_run(*args: str | Path) -> None:
    result = subprocess.run(
        [_promtool(), *args], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_are_valid_prometheus_rules() -> None:
    """promtool accepts the rule file: expressions parse, templates compile."""
    _promtool_run("check", "rules", ROOT / "compose" / "alerts.yml")


def test_each_alert_fires_on_its_trouble_and_only_then() -> None:
    """A stopped clock, a dependency away, late deliveries, an overdue backlog, dead letters
    and an unscrapable replica each fire their alert after its `for`, with the labels and
    text an operator reads; healthy series and other causes do not."""
    _promtool_run("test", "rules", HERE / "alerts_test.yml")

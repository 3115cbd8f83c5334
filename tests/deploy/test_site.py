"""The documentation site builds strictly, and its references are generated from the code
with a description for every entry."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blackbox import settings
from blackbox.errors import DeadLetterReason
from blackbox.kafka.events import Outcome
from docs.hooks import reference
from tests.deploy.chart import ROOT


def test_the_site_builds_strictly_with_search_and_its_references(tmp_path: Path) -> None:
    """`mkdocs build --strict`: a broken link or anchor, a page missing from the nav or an
    example file that is gone fails the build. The generated references and the search
    index are in the site."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for page in reference.PAGES:
        assert (site / page.path.removesuffix(".md") / "index.html").is_file(), page.path
    assert json.loads((site / "reference" / "openapi.json").read_text())["paths"]
    assert (site / "search" / "search_index.json").is_file()
    assert "BlackboxRedisFull" in (site / "runbooks" / "index.html").read_text()


def test_every_reference_entry_has_a_description() -> None:
    """Every setting, command, option, API operation, dead-letter reason, event outcome,
    metric and exit code says what it is."""
    assert reference.missing() == []


def test_an_entry_without_a_description_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above would fail on a setting, an environment variable the code reads, a
    reason or an outcome left undescribed."""
    bare = dataclasses.replace(settings.VARIABLES[0], help=" ")
    monkeypatch.setattr(reference, "VARIABLES", (bare, *settings.VARIABLES[1:]))
    monkeypatch.delitem(reference.REASONS, DeadLetterReason.EXPIRED)
    monkeypatch.delitem(reference.OUTCOMES, Outcome.FIRED)
    monkeypatch.delitem(reference.OTHER_VARIABLES, "TANSU_BIN")
    assert reference.missing() == [
        f"setting {bare.name}",
        "variable TANSU_BIN",
        "reason expired",
        "outcome fired",
    ]


def test_the_settings_have_one_table_the_generated_one() -> None:
    """One source per fact: no hand-written page keeps a table of the settings beside the
    generated reference, and the Settings page links to it."""
    tables = [page.name for page in (ROOT / "docs").glob("*.md")
              if "| variable | default |" in page.read_text()]  # fmt: skip
    assert tables == []
    assert "(reference/settings.md)" in (ROOT / "docs" / "configuration.md").read_text()


def test_the_settings_reference_names_the_brokers_and_what_the_port_serves() -> None:
    """The generated reference has a row of its own for KAFKA_BOOTSTRAP_SERVERS with its
    default, and says BLACKBOX_HTTP_HOST serves the page, the API and the probes."""
    lines = reference.settings_page().splitlines()
    rows = {line.split(" | ")[0].strip("| `"): line for line in lines if line.startswith("| `")}
    assert "| `localhost:9092` |" in rows["KAFKA_BOOTSTRAP_SERVERS"]
    assert settings.kafka_config({})["bootstrap.servers"] == "localhost:9092"
    for served in ("(/)", "/api/v1", "/live", "/ready", "/metrics"):
        assert served in rows["BLACKBOX_HTTP_HOST"], served


def test_the_exit_codes_reference_names_one_code_for_not_found() -> None:
    """The exit codes page, generated from blackbox/exits.py, gives every command that can
    meet an id blackbox does not hold the one code 3."""
    row = next(line for line in reference.exit_codes_page().splitlines()
               if "`EXIT_UNCHANGED`" in line)  # fmt: skip
    assert row.startswith("| `3` |")
    for command in ("cancel", "pause", "resume", "reschedule", "show", "not_found"):
        assert command in row, command


def test_the_references_describe_only_what_exists() -> None:
    """No description is left for a reason or outcome the code no longer has."""
    assert set(reference.REASONS) == set(DeadLetterReason)
    assert set(reference.OUTCOMES) == set(Outcome)


def test_the_references_list_every_entry() -> None:
    """Each setting, reason, outcome and metric appears on its generated page."""
    pages = {page.path: page.render() for page in reference.PAGES}
    assert all(f"`{v.name}`" in pages["reference/settings.md"] for v in settings.VARIABLES)
    reasons = pages["reference/dead-letter-reasons.md"]
    assert all(f"`{r.value}`" in reasons for r in DeadLetterReason)
    outcomes = pages["reference/event-outcomes.md"]
    assert all(f"`{o.value}`" in outcomes for o in Outcome)
    names = [m.name for m in reference.metrics()]
    assert "blackbox_series_passed_total" in names
    assert {"blackbox_up", "blackbox_ready", "blackbox_overdue_messages"} <= set(names)
    assert all(name in pages["reference/metrics.md"] for name in names)
    cli = pages["reference/cli.md"]
    for option in (
        "--redis-port",
        "--kafka-port",
        "--state-dir",
        "--no-service",
        "--cursor",
        "--wait",
    ):
        assert f"`{option}`" in cli, option

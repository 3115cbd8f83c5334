"""The guide's job pages (docs/jobs/), each a script in examples/jobs/ included as printed,
run as a user runs them in the clone after `make run` (against a service of their own,
reached through KAFKA_BOOTSTRAP_SERVERS and BLACKBOX_API_URL): each prints the answers and
listings its page says it prints."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import orjson

from blackbox.clock import now_ms
from tests.integration.conftest import ServiceFactory

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"
# The shell scripts call the clone's blackbox: `make test` made it, as `make run` does.
BLACKBOX = ROOT / ".venv" / "bin" / "blackbox"


def _run(script: str, env: dict[str, str]) -> tuple[int, str]:
    """Run one job's script from the clone's root; its exit code and what it printed (its
    standard output: the logs go to its standard error, shown when the test fails)."""
    assert BLACKBOX.exists(), f"{BLACKBOX} is missing: make setup makes it"
    done = subprocess.run(["/bin/sh", str(JOBS / script)], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    print(done.stderr)  # noqa: T201 - the scripts' logs, for a failure's report
    return done.returncode, done.stdout


def _dev_open(start_service: ServiceFactory, env: dict[str, str]) -> dict[str, str]:
    """A service as `make run` serves it (the API open to this machine), and the
    environment that reaches it."""
    service = start_service(BLACKBOX_API_DEV_OPEN="true")
    assert service.endpoints is not None
    api = f"http://127.0.0.1:{service.endpoints.port}"
    return {**env, "BLACKBOX_API_DEV_OPEN": "true", "BLACKBOX_API_URL": api}


def test_every_job_page_includes_its_script_as_printed() -> None:
    """Each page under docs/jobs/ shows a script of examples/jobs/ by inclusion (what the
    tests run is what the page prints), and every script has its page."""
    included = set()
    for page in (ROOT / "docs" / "jobs").glob("*.md"):
        included |= set(re.findall(r'--8<-- "examples/jobs/([\w.-]+)"', page.read_text()))
    assert included == {p.name for p in JOBS.iterdir()}


def test_the_reminder_is_scheduled_thirty_minutes_out(
    start_service: ServiceFactory, env: dict[str, str]
) -> None:
    """docs/jobs/reminder.md: the send answers `scheduled`, and `show` finds the reminder
    due 30 minutes from the send, for its topic, in the caller's scope."""
    env = _dev_open(start_service, env)
    sent_ms = now_ms()
    code, output = _run("reminder.sh", env)
    assert code == 0, output
    assert output.splitlines()[0] == "scheduled", output
    shown = orjson.loads(output[output.index("{") :])["item"]
    assert (shown["blackbox_id"], shown["topic"]) == ("@shop/cart-42", "reminders"), shown
    assert sent_ms + 1_800_000 <= shown["due_ms"] <= now_ms() + 1_800_000, shown


def test_the_cancel_ends_the_reminder(start_service: ServiceFactory, env: dict[str, str]) -> None:
    """docs/jobs/cancel.md: before the reminder was sent, the cancel finds nothing (exit 3,
    `not_found`); after it, it answers `cancelled`, and again `cancelled` when repeated,
    as the page says."""
    env = _dev_open(start_service, env)
    code, output = _run("cancel.sh", env)
    assert (code, output.splitlines()[0]) == (3, "not_found"), output
    assert _run("reminder.sh", env)[0] == 0
    for _ in range(2):
        code, output = _run("cancel.sh", env)
        assert (code, output.splitlines()[0]) == (0, "cancelled"), output


def test_the_weekday_report_lists_its_runs_in_berlin_time(
    start_service: ServiceFactory, env: dict[str, str]
) -> None:
    """docs/jobs/weekday-report.md: the series answers `scheduled`, and its listing gives
    its next runs at 09:00 on Berlin's clock, with Berlin's offset (+01:00 or +02:00)."""
    env = _dev_open(start_service, env)
    code, output = _run("weekday-report.sh", env)
    assert code == 0, output
    assert output.splitlines()[0] == "scheduled", output
    assert "@shop/weekday-report" in output, output
    runs = re.findall(r"\d{4}-\d\d-\d\dT(\d\d:\d\d):00(\+0[12]:00)", output)
    assert runs and all(time == "09:00" for time, _ in runs), output


def test_the_failed_order_is_retried_once_and_then_processed(
    start_service: ServiceFactory, env: dict[str, str]
) -> None:
    """docs/jobs/retry.md: the worker prints the two lines the page prints: the first
    attempt failed, the second, delivered again by blackbox, ok."""
    service = start_service()
    code, output = _run("retry.sh", {**env, "BLACKBOX_INTAKE_TOPIC": service.settings.intake_topic})
    assert code == 0, output
    page = (ROOT / "docs" / "jobs" / "retry.md").read_text()
    printed = re.search(r"```text\n(.*?)```", page, re.DOTALL)
    assert printed is not None
    assert output.splitlines() == printed[1].splitlines(), output

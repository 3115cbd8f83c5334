"""The admin page in headless Chromium (Debian's chromium driven by Playwright): it loads
without console errors, shows a scheduled message, cancels one that then never arrives,
and reschedules another; it shows series apart, and pauses, resumes and cancels them; its
footer names the release."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from blackbox.api.views import local_text
from blackbox.clock import now_ms
from blackbox.recurrence import Recurrence
from blackbox.schedule import Schedule, first_occurrence
from blackbox.service import Service
from blackbox.version import version
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.integration.test_api import fill
from tests.kafkatools import produce, unique

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip
# Screenshots of the run land here, to look at (and refresh docs/admin.png from).
SHOTS = Path(__file__).resolve().parents[2] / ".screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


def open_page(browser: Browser, service: Service, errors: list[str]) -> Page:
    """The page, with console errors, page errors and any request leaving the service
    collected in `errors` (the page works offline: nothing from elsewhere)."""
    assert service.endpoints is not None
    base = f"http://127.0.0.1:{service.endpoints.port}/"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "request", lambda r: None if r.url.startswith((base, "data:")) else errors.append(r.url)
    )
    page.goto(base)
    return page


def test_the_page_shows_cancels_and_reschedules(
    browser: Browser, start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """A scheduled message shows in the table; Cancel removes it and it never arrives;
    Reschedule moves another, which then arrives at its new time; no console errors."""
    service = start_service(BLACKBOX_API_DEV_OPEN="true")
    target = reader(unique("page"))
    # A refused record, so the page has a dead letter to show.
    produce(service.settings.kafka["bootstrap.servers"], service.settings.intake_topic,
            [b'{"topic": "orders", "message": 1}'])  # fmt: skip
    start = now_ms()
    fill(service, [
        Schedule("@web/cancel-me", target.topic, b'{"order": 1}', start + 8_000, caller=b"web"),
        Schedule("@web/move-me", target.topic, b'{"order": 2}', start + 600_000, caller=b"web"),
        *(Schedule(f"@shop/o-{i}", "orders", b'{"sku": %d}' % i, start + 90_000 + i * 45_000,
                   caller=b"shop") for i in range(12)),
    ])  # fmt: skip
    errors: list[str] = []
    page = open_page(browser, service, errors)
    cancel_row = page.locator('tr[data-id="@web/cancel-me"]')
    cancel_row.wait_for()
    SHOTS.mkdir(exist_ok=True)
    page.wait_for_function("document.getElementById('pending').textContent === '14'")
    page.screenshot(path=str(SHOTS / "admin-before.png"), full_page=True)
    cancel_row.locator("button.cancel").click()
    cancel_row.wait_for(state="detached")
    move_row = page.locator('tr[data-id="@web/move-me"]')
    move_row.locator("input.countdown").fill("2")
    move_row.locator("button.reschedule").click()
    page.locator("#status", has_text="updated").first.wait_for()
    records = target.wait_count(1, timeout=20)
    assert [r.value for r in records] == [b'{"order": 2}']
    assert records[0].received_ms - start < 60_000
    target.wait_for(lambda _r: now_ms() > start + 10_000, timeout=15)  # past the cancelled due
    assert [r.value for r in target.records] == [b'{"order": 2}']
    page.locator("#dead-letters tbody tr").first.wait_for(timeout=30_000)
    page.screenshot(path=str(SHOTS / "admin.png"), full_page=True)
    assert errors == []


def test_the_page_asks_for_a_token_when_the_api_needs_one(
    browser: Browser, start_service: ServiceFactory
) -> None:
    """With a token configured, the page prompts for it, then shows the data."""
    service = start_service(BLACKBOX_API_TOKEN="page-token-0123456789")  # noqa: S106
    fill(service, [Schedule("@t/one", "t", b"x", now_ms() + 60_000, caller=b"t")])
    errors: list[str] = []
    page = open_page(browser, service, errors)
    page.locator("#token-dialog[open]").wait_for()
    page.fill("#token-input", "page-token-0123456789")
    page.click("#token-form button")
    page.locator('tr[data-id="@t/one"]').wait_for()
    # The browser reports each refused request (401) as a console error: nothing else.
    assert all("401" in e for e in errors), errors


def test_the_footer_names_the_release_before_any_token(
    browser: Browser, start_service: ServiceFactory
) -> None:
    """The footer names the release serving the page (what `blackbox --version` prints),
    already while the page waits for a token: an operator sees which version answers."""
    service = start_service(BLACKBOX_API_TOKEN="page-token-0123456789")  # noqa: S106
    page = open_page(browser, service, [])
    page.locator("#token-dialog[open]").wait_for()
    assert page.locator("footer").inner_text() == f"blackbox {version()}"


def test_the_page_shows_series_apart_and_pauses_resumes_and_cancels_them(
    browser: Browser, start_service: ServiceFactory
) -> None:
    """Guarantee 8: a series shows in the Series table, not among the one-off schedules,
    with its rule, zone, next occurrences on its zone's clock with the offset (09:00+01:00
    or +02:00 in Berlin) and runs; Pause, Resume and Cancel act on it through the intake,
    and Redis holds what the page shows; no console errors."""
    service = start_service(BLACKBOX_API_DEV_OPEN="true")
    start = now_ms()
    series = first_occurrence(Recurrence(cron="0 9 * * 1-5", timezone="Europe/Berlin",
                                         limit=10), start)  # fmt: skip
    fill(service, [
        Schedule("@web/once", "orders", b"{}", start + 600_000, caller=b"web"),
        Schedule("@web/daily", "reports", b"run", series.occurrence_ms, caller=b"web",
                 series=series),
    ])  # fmt: skip
    errors: list[str] = []
    page = open_page(browser, service, errors)
    row = page.locator('#series tr[data-id="@web/daily"]')
    row.wait_for()
    page.locator('#schedules tr[data-id="@web/once"]').wait_for()
    assert page.locator('#schedules tr[data-id="@web/daily"]').count() == 0
    assert page.locator('#series tr[data-id="@web/once"]').count() == 0
    berlin = series.rule.zone
    upcoming = [local_text(at, berlin) for at in series.rule.upcoming(series.occurrence_ms, 5)]
    assert row.locator("td.occurrences").inner_text().split("\n") == upcoming
    assert row.locator("td.next").inner_text() == upcoming[0]
    assert all(t[11:16] == "09:00" and t[-6:] in ("+01:00", "+02:00") for t in upcoming)
    header = page.locator("#series thead").inner_text()
    assert "(series' zone)" in header and "UTC" not in header
    assert row.locator("td.zone").inner_text() == "Europe/Berlin"
    assert row.locator("td.rule").inner_text().startswith("cron 0 9 * * 1-5")
    assert row.locator("td.runs").inner_text() == "0 / 10"

    row.locator("button.pause").click()
    row.locator("td.paused").wait_for()
    assert _held(service, "@web/daily")
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "admin-series.png"), full_page=True)
    row.locator("button.resume").click()
    row.locator("button.pause").wait_for()
    assert not _held(service, "@web/daily")
    row.locator("button.cancel").click()
    row.wait_for(state="detached")
    assert service.store.load("@web/daily") is None
    assert errors == []


def _held(service: Service, blackbox_id: str) -> bool:
    stored = service.store.load(blackbox_id)
    assert stored is not None and stored.series is not None
    return stored.series.paused

"""How `blackbox list` prints a page of the API's listing: a header naming every column, one
row per schedule, due times as RFC 3339 (UTC for schedules, a series' next run on its own
zone's clock with the offset), and a line saying so when nothing is pending. Pure: it
formats what the API answered."""

from __future__ import annotations

from typing import Any

from blackbox.api.views import utc_text

SCHEDULE_COLUMNS = ("DUE (UTC)", "ID", "TOPIC", "MESSAGE (START)")
SERIES_COLUMNS = ("NEXT RUN (SERIES' ZONE)", "ID", "RULE", "ZONE", "FIRED", "LIMIT", "STATE")
NOTHING = "nothing pending"
GAP = "  "


def page_lines(items: list[dict[str, Any]], *, series: bool, more: bool = False) -> list[str]:
    """The lines printed for one page; `more` when the API has another page after it."""
    if not items:
        return [NOTHING + (" on this page" if more else "")]
    if series:
        return table(SERIES_COLUMNS, [series_row(item) for item in items])
    return table(SCHEDULE_COLUMNS, [schedule_row(item) for item in items])


def schedule_row(item: dict[str, Any]) -> tuple[str, ...]:
    """A listed schedule: when it falls due, its id, its target topic, its message's start."""
    return utc_text(item["due_ms"]), item["blackbox_id"], item["topic"], item["preview"]


def series_row(item: dict[str, Any]) -> tuple[str, ...]:
    """A listed series: its next run in its own zone, id, rule, zone, runs fired, the limit
    on them (`none`) and whether it is paused."""
    series = item["series"]
    rule = series["rule"]
    when = f"cron {rule['cron']!r}" if rule["cron"] is not None else f"every {rule['every']:g} s"
    upcoming = series["next"][0]["local"] if series["next"] else "none"
    limit = "none" if rule["limit"] is None else str(rule["limit"])
    state = "paused" if series["paused"] else "active"
    return upcoming, item["blackbox_id"], when, rule["timezone"], str(series["fired"]), limit, state


def table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Rows under their header, each column as wide as its widest cell (the last not
    padded: a message's start may be long)."""
    widths = [max(len(row[i]) for row in (columns, *rows)) for i in range(len(columns) - 1)]
    return [_row(row, widths) for row in (columns, *rows)]


def _row(cells: tuple[str, ...], widths: list[int]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=False)]
    return GAP.join([*padded, cells[-1]])

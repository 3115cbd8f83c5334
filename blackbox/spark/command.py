"""`blackbox spark schedule` and `blackbox spark audit`: their options, and running them.

This module imports no PySpark at load time: `blackbox --help` works without the extra, and
`blackbox spark ...` without it says how to install it (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from blackbox import spark
from blackbox.errors import SettingsError
from blackbox.exits import EXIT_FINDINGS, EXIT_OK
from blackbox.settings import Settings
from blackbox.signing import Signer

DUE_SOURCES = ("timestamp", "epoch_s", "epoch_ms", "delay", "wall_clock")
_RAW = argparse.RawDescriptionHelpFormatter


def add_commands(commands: Any) -> None:
    """Add `spark schedule` and `spark audit` to the `blackbox` parser."""
    group = commands.add_parser("spark", help="bulk scheduling and the delivery audit on Spark")
    jobs = group.add_subparsers(required=True, metavar="JOB")
    _schedule_options(jobs)
    _audit_options(jobs)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", help="Spark master (default local[*]; ignored under "
                        "spark-submit, which sets its own)")  # fmt: skip
    parser.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Java Kafka client property for Spark's connector (repeatable)",
    )


def _schedule_options(jobs: Any) -> None:
    p = jobs.add_parser(
        "schedule", formatter_class=_RAW, help="schedule every row of a dataset",
        description="Schedule each row of Parquet, CSV or JSON-lines INPUT through the intake "
        "topic.\nRows are judged by the service's own rules; rejects are written with their "
        "reason.\nIds blackbox already scheduled are skipped, so a re-run sends nothing twice.",
    )  # fmt: skip
    p.add_argument("input", nargs="+", metavar="INPUT", help="files, folders or globs")
    p.add_argument("--format", choices=("parquet", "csv", "json"), help="default: by suffix "
                   "(.csv, .json/.jsonl, else Parquet)")  # fmt: skip
    p.add_argument("--encoding", default="UTF-8", help="of CSV and JSON input (default UTF-8; "
                   "a byte order mark is dropped)")  # fmt: skip
    p.add_argument("--caller", required=True, help="the CALLER_SERVICE the rows are sent as")
    p.add_argument("--id", metavar="COLUMN", help="the rows' ids (default: a hash of the row)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--topic", help="deliver every row to this topic")
    target.add_argument("--topic-column", metavar="COLUMN", help="the column naming the topic")
    p.add_argument("--message", metavar="COLUMN", default="message", help="default: message")
    p.add_argument(
        "--message-kind",
        choices=("text", "json", "binary"),
        help="default: by type (string: text, bytes: binary, struct: its JSON)",
    )
    p.add_argument("--key", metavar="COLUMN", help="the delivered record's key")
    p.add_argument("--traceparent", metavar="COLUMN",
                   help="each row's W3C traceparent, carried to its delivered record")  # fmt: skip
    due = p.add_mutually_exclusive_group(required=True)
    due.add_argument("--due", metavar="COLUMN", help="the column saying when (see --due-as)")
    due.add_argument("--at", help="one instant for all: RFC 3339 with an offset, or epoch s")
    due.add_argument("--countdown", type=float, metavar="SECONDS", help="one delay for all")
    p.add_argument(
        "--due-as",
        choices=DUE_SOURCES,
        default="timestamp",
        help="what --due holds (default timestamp)",
    )
    p.add_argument("--zone-column", metavar="COLUMN", help="an IANA time zone per row: --due "
                   "is then local wall-clock time there ('2026-11-24 09:00')")  # fmt: skip
    p.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="spread each due time by a stable share of this window",
    )
    p.add_argument("--rejects", metavar="PATH", help="write rejected rows here (overwritten)")
    p.add_argument(
        "--rejects-format",
        choices=("json", "parquet", "csv"),
        default="json",
        help="the rejected rows' format (default json)",
    )
    p.add_argument("--dry-run", action="store_true", help="judge the rows, send nothing")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print the first N good "
                   "rows' intake records exactly as they are (or would be) produced")  # fmt: skip
    p.add_argument(
        "--since",
        help="read the events topic from here to find the ids already "
        "scheduled: RFC 3339 or epoch s, no later than the first run (default: all)",
    )
    p.add_argument(
        "--resend",
        action="store_true",
        help="send ids blackbox already scheduled again (as updates)",
    )
    p.add_argument("--summary", metavar="PATH", help="also write the summary here as JSON")
    p.add_argument("--signing-key", metavar="FILE",
                   help="sign every intake record with this Ed25519 private key (PEM)")  # fmt: skip
    p.add_argument("--key-id", help="the id the caller's policy lists the key's public half under")
    _common(p)
    p.set_defaults(command=cmd_schedule)


def _audit_options(jobs: Any) -> None:
    p = jobs.add_parser(
        "audit", formatter_class=_RAW, help="check that what was scheduled was delivered",
        description="Audit deliveries over a window: lost, duplicated, early, late, after a "
        "cancel,\ndead letters; a series (recurring schedule) by occurrence. Writes Parquet "
        "tables\nand report.html under --out.\n"
        "Exit 3 when anything is lost, or late beyond --max-late.",
    )  # fmt: skip
    p.add_argument("--out", required=True, help="folder for the tables and the report")
    p.add_argument("--since", help="window start: RFC 3339 or epoch s (default: 24 h before)")
    p.add_argument("--until", help="window end: RFC 3339 or epoch s (default: now)")
    p.add_argument(
        "--margin",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="what is due this close to the end is not yet lost (default 60)",
    )
    p.add_argument(
        "--max-late", type=float, metavar="SECONDS", help="fail when a delivery was later than this"
    )
    p.add_argument(
        "--topic",
        action="append",
        default=[],
        help="a target topic (repeatable; default: those scheduled to)",
    )
    _common(p)
    p.set_defaults(command=cmd_audit)


def instant_ms(text: str) -> int:
    """RFC 3339 with an offset, or epoch seconds, as epoch ms."""
    try:
        return round(float(text) * 1000)
    except ValueError:
        pass
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise SettingsError(f"{text!r} has no UTC offset (add Z or +hh:mm)")
    return round(moment.timestamp() * 1000)


def cmd_schedule(args: argparse.Namespace, settings: Settings) -> int:
    spark.require()
    from blackbox.spark import inputs, schedule, session  # noqa: PLC0415 - needs the extra
    from blackbox.spark.rows import Judge, MessageKind  # noqa: PLC0415

    columns = schedule.Columns(
        id=args.id, topic_column=args.topic_column, topic=args.topic, message=args.message,
        message_kind=MessageKind(args.message_kind) if args.message_kind else None,
        key=args.key, due=args.due, due_source=args.due_as,
        at_ms=instant_ms(args.at) if args.at else None, countdown=args.countdown,
        zone=args.zone_column, traceparent=args.traceparent,
    )  # fmt: skip
    job = _schedule_run(args, settings)
    session_ = session.start(args.master, "blackbox-schedule", ui=sys.stderr.isatty())
    source = inputs.Source(args.input, args.format, args.encoding)
    frame = inputs.read(session_, source, args.message)
    rows, kind, due_kind = schedule.canonical(frame, columns, blank_is_none=source.kind == "csv")
    judge = Judge(args.caller, _limits(settings), _policy(settings), kind, due_kind,
                  round(args.jitter * 1000))  # fmt: skip
    summary = schedule.run(session_, rows, judge, job)
    for record in summary.shown:
        print(record.line())  # noqa: T201 - the command's output
    _print_summary(summary.figures(), args.summary)
    return EXIT_OK


def _schedule_run(args: argparse.Namespace, settings: Settings) -> Any:
    from blackbox.spark import schedule, topics  # noqa: PLC0415

    return schedule.Run(
        kafka=topics.options(settings.kafka, args.kafka_option),
        intake_topic=settings.intake_topic, events_topic=settings.events_topic,
        rejects=args.rejects, dry_run=args.dry_run, skip_known=not args.resend,
        rejects_format=args.rejects_format, show=args.show,
        since_ms=instant_ms(args.since) if args.since else None,
        signing=_signing(args),
    )  # fmt: skip


def _signing(args: argparse.Namespace) -> tuple[bytes, str] | None:
    """The private key (PEM) and key id to sign with, checked here, before Spark starts."""
    if args.signing_key is None and args.key_id is None:
        return None
    if args.signing_key is None or args.key_id is None:
        raise SettingsError("--signing-key and --key-id go together")
    try:
        pem = Path(args.signing_key).read_bytes()
        Signer.from_pem(pem, args.key_id)
    except (OSError, ValueError) as e:
        raise SettingsError(f"--signing-key {args.signing_key}: {e}") from e
    return pem, args.key_id


def _limits(settings: Settings) -> Any:
    from blackbox.intake.runner import limits_of  # noqa: PLC0415 - the service's own limits

    return limits_of(settings)


def _policy(settings: Settings) -> Any:
    from blackbox.intake.runner import caller_policy_of  # noqa: PLC0415 - the service's own policy

    return caller_policy_of(settings)


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    spark.require()
    from blackbox.spark import audit, report, session, topics  # noqa: PLC0415

    until = instant_ms(args.until) if args.until else int(time.time() * 1000)
    since = instant_ms(args.since) if args.since else until - 86_400_000
    job = audit.Audit(
        kafka=topics.options(settings.kafka, args.kafka_option),
        events_topic=settings.events_topic,
        window=audit.Window(since, until, round(args.margin * 1000)),
        out=args.out, targets=args.topic,
        max_late_ms=None if args.max_late is None else round(args.max_late * 1000),
    )  # fmt: skip
    session_ = session.start(args.master, "blackbox-audit", ui=sys.stderr.isatty())
    findings = audit.run(session_, job)
    page = report.write(findings, job)
    _print_summary({**report.summary(findings, job), "report": str(page)}, None)
    return EXIT_FINDINGS if findings.failed() else EXIT_OK


def _print_summary(summary: dict[str, Any], path: str | None) -> None:
    text = json.dumps(summary, indent=2, default=str)
    print(text)  # noqa: T201 - the command's output
    if path is not None:
        with open(path, "w") as f:
            f.write(text + "\n")

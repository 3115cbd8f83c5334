"""`blackbox spark schedule`: a dataset of rows becomes schedules on the intake topic.

Read Parquet, CSV or JSON lines; map the user's columns onto the canonical ones (id, topic,
message, key, due, zone); judge every row with the service's own rules (`rows.Judge`); write
the rejects with their reason; send the good rows to the intake topic as CALLER_SERVICE,
keyed by their id. Ids blackbox already answered `scheduled` or `updated` for (read from the
events topic) are skipped, so a re-run schedules nothing twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import structlog
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason, SettingsError
from blackbox.events import Outcome
from blackbox.spark import topics
from blackbox.spark.rows import DueKind, Judge, MessageKind

log = structlog.get_logger("blackbox.spark.schedule")

JUDGED = T.StructType(
    [
        T.StructField("id", T.StringType()),
        T.StructField("blackbox_id", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("due_ms", T.LongType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("reason", T.StringType()),
        T.StructField("detail", T.StringType()),
        T.StructField("source", T.StringType()),
    ]
)
_ARROW_JUDGED = pa.schema(
    [(f.name, pa.int64() if f.name == "due_ms" else pa.binary() if f.name == "value"
      else pa.string()) for f in JUDGED.fields]
)  # fmt: skip


@dataclass(frozen=True)
class Columns:
    """Which input column (or constant) gives each part of a schedule."""

    id: str | None = None
    topic_column: str | None = None
    topic: str | None = None
    message: str = "message"
    message_kind: MessageKind | None = None  # None: from the column's type
    key: str | None = None
    due: str | None = None
    due_source: str = "timestamp"
    at_ms: int | None = None
    countdown: float | None = None
    zone: str | None = None


@dataclass
class Summary:
    """What a run did, by outcome."""

    rows: int = 0
    valid: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    already_scheduled: int = 0
    sent: int = 0
    dry_run: bool = False
    seconds: float = 0.0

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


def read_input(spark: SparkSession, paths: Sequence[str], fmt: str | None) -> DataFrame:
    """Parquet, CSV (with a header line) or JSON lines, by `fmt` or the first path's suffix."""
    kind = fmt or _format_of(paths[0])
    reader = spark.read
    if kind == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    return reader.format(kind).load(list(paths))


def _format_of(path: str) -> str:
    name = path.lower().rstrip("/*")
    for suffix, kind in ((".csv", "csv"), (".json", "json"), (".jsonl", "json")):
        if name.endswith(suffix):
            return kind
    return "parquet"


def canonical(frame: DataFrame, mapping: Columns) -> tuple[DataFrame, MessageKind, DueKind]:
    """The input with the canonical columns, each row's original kept as JSON (`source`)."""
    _check_columns(frame, mapping)
    message, kind = _message(frame, mapping)
    due, due_kind = _due(frame, mapping)
    source = F.to_json(F.struct(*[F.col(f"`{c}`") for c in frame.columns]))
    selected = frame.select(
        (F.col(f"`{mapping.id}`").cast("string") if mapping.id else F.sha2(source, 256))
        .alias("id"),
        (F.col(f"`{mapping.topic_column}`") if mapping.topic_column else F.lit(mapping.topic))
        .alias("topic"),
        message.alias("message"),
        (F.col(f"`{mapping.key}`").cast("string") if mapping.key else F.lit(None)).alias("key"),
        due.alias("due"),
        (F.col(f"`{mapping.zone}`").cast("string") if mapping.zone else F.lit(None)).alias("zone"),
        source.alias("source"),
    )  # fmt: skip
    return selected, kind, due_kind


def _check_columns(frame: DataFrame, mapping: Columns) -> None:
    named = [mapping.id, mapping.topic_column, mapping.message, mapping.key, mapping.due,
             mapping.zone]  # fmt: skip
    missing = [c for c in named if c is not None and c not in frame.columns]
    if missing:
        raise SettingsError(f"the input has no column {missing[0]!r} (it has {frame.columns})")


def _message(frame: DataFrame, mapping: Columns) -> tuple[Column, MessageKind]:
    column = F.col(f"`{mapping.message}`")
    kind = frame.schema[mapping.message].dataType
    if isinstance(kind, T.StructType | T.MapType | T.ArrayType):
        return F.to_json(column), MessageKind.JSON
    if mapping.message_kind is not None:
        return column, mapping.message_kind
    if isinstance(kind, T.BinaryType):
        return column, MessageKind.BINARY
    if isinstance(kind, T.StringType):
        return column, MessageKind.TEXT
    return column, MessageKind.JSON  # numbers and booleans are JSON values


def _due(frame: DataFrame, mapping: Columns) -> tuple[Column, DueKind]:
    if mapping.at_ms is not None:
        return F.lit(mapping.at_ms).cast("long"), DueKind.AT_MS
    if mapping.countdown is not None:
        return F.lit(mapping.countdown).cast("double"), DueKind.DELAY
    if mapping.due is None:
        raise SettingsError("give a due column (--due), --at or --countdown")
    column = F.col(f"`{mapping.due}`")
    if mapping.zone is not None or mapping.due_source == "wall_clock":
        return _wall_clock(frame, mapping.due, column), DueKind.WALL_CLOCK
    return _DUE_COLUMNS[mapping.due_source](column)


# What each kind of due column becomes before the Python workers see it.
_DUE_COLUMNS: dict[str, Callable[[Column], tuple[Column, DueKind]]] = {
    "timestamp": lambda c: (F.unix_millis(c.cast("timestamp")), DueKind.AT_MS),
    "epoch_s": lambda c: (F.ceil(c.cast("double") * 1000).cast("long"), DueKind.AT_MS),
    "epoch_ms": lambda c: (c.cast("long"), DueKind.AT_MS),
    "delay": lambda c: (c.cast("double"), DueKind.DELAY),
}


def _wall_clock(frame: DataFrame, name: str, column: Column) -> Column:
    """Local times as text: a timestamp column is read as wall-clock time (session in UTC)."""
    if isinstance(frame.schema[name].dataType, T.TimestampType | T.TimestampNTZType):
        return F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss.SSS")
    return column.cast("string")


def judged(rows: DataFrame, judge: Judge, now_ms: int) -> DataFrame:
    """Every row's verdict, run in the Python workers with the service's own code (rows
    cross in Arrow batches); an id that appears more than once in the input is rejected in
    each of its rows."""

    def verdicts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out = [_verdict(judge, row, now_ms) for row in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(out, schema=_ARROW_JUDGED)

    frame = rows.mapInArrow(verdicts, JUDGED)
    copies = F.count(F.lit(1)).over(Window.partitionBy("id"))
    repeated = frame.withColumn("copies", copies)
    twice = F.col("id").isNotNull() & (F.col("copies") > 1) & F.col("reason").isNull()
    return repeated.select(
        *[c for c in frame.columns if c not in ("reason", "detail")],
        F.when(twice, F.lit(DeadLetterReason.INVALID_ID.value)).otherwise(F.col("reason"))
        .alias("reason"),
        F.when(twice, F.format_string("the id appears %d times in the input", F.col("copies")))
        .otherwise(F.col("detail")).alias("detail"),
    )  # fmt: skip


def _verdict(judge: Judge, row: dict[str, Any], now_ms: int) -> dict[str, Any]:
    v = judge.row(row, now_ms)
    return {"id": v.schedule_id, "blackbox_id": v.blackbox_id, "topic": v.topic,
            "due_ms": v.due_ms, "value": v.value, "reason": v.reason, "detail": v.detail,
            "source": row["source"]}  # fmt: skip


def known_ids(
    spark: SparkSession, kafka: Mapping[str, str], events_topic: str, caller: str
) -> DataFrame:
    """Stored ids blackbox has answered `scheduled` or `updated` for, for this caller."""
    schema = "outcome string, caller string, blackbox_id string"
    events = topics.read(spark, kafka, [events_topic], None)
    parsed = events.select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
    answered = F.col("e.outcome").isin(Outcome.SCHEDULED.value, Outcome.UPDATED.value)
    mine = parsed.where(answered & (F.col("e.caller") == caller))
    return mine.select(F.col("e.blackbox_id").alias("blackbox_id")).distinct()


def intake_records(good: DataFrame, caller: str) -> DataFrame:
    """The intake records of the good rows: keyed by id, CALLER_SERVICE as a header."""
    caller_header = F.struct(F.lit(CALLER_HEADER).alias("key"),
                             F.lit(caller.encode("utf-8")).alias("value"))  # fmt: skip
    return good.select(
        F.col("id").cast("binary").alias("key"),
        F.col("value"),
        F.array(caller_header).alias("headers"),
    )


@dataclass(frozen=True)
class Run:
    """One run's settings beside the column mapping."""

    kafka: Mapping[str, str]
    intake_topic: str
    events_topic: str
    rejects: str | None
    dry_run: bool = False
    skip_known: bool = True
    rejects_format: str = "json"


def run(spark: SparkSession, frame: DataFrame, mapping: Columns, judge: Judge, job: Run) -> Summary:
    """Judge, write the rejects, send the good rows; the summary counts every row once."""
    started = time.monotonic()
    rows, _, _ = canonical(frame, mapping)
    verdicts = judged(rows, judge, int(time.time() * 1000))
    verdicts = verdicts.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summary = _count(verdicts, job.dry_run)
        log.info("rows_judged", rows=summary.rows, valid=summary.valid, rejected=summary.rejected)
        if job.rejects is not None:
            _write_rejects(verdicts, job.rejects, job.rejects_format)
        if not job.dry_run:
            _send(spark, verdicts.where(F.col("reason").isNull()), judge.caller, job, summary)
    finally:
        verdicts.unpersist()
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def _count(verdicts: DataFrame, dry_run: bool) -> Summary:
    by_reason = {r["reason"]: int(r["count"]) for r in verdicts.groupBy("reason").count().collect()}
    valid = by_reason.pop(None, 0)
    rejected = dict(sorted(by_reason.items()))
    return Summary(rows=valid + sum(rejected.values()), valid=valid, rejected=rejected,
                   dry_run=dry_run)  # fmt: skip


def _write_rejects(verdicts: DataFrame, path: str, fmt: str) -> None:
    rejects = verdicts.where(F.col("reason").isNotNull())
    rejects = rejects.select("id", "topic", "reason", "detail", "source")
    rejects.write.mode("overwrite").format(fmt).save(path)
    log.info("rejects_written", path=path, format=fmt)


def _send(spark: SparkSession, good: DataFrame, caller: str, job: Run, summary: Summary) -> None:
    if job.skip_known:
        known = known_ids(spark, job.kafka, job.events_topic, caller)
        fresh = good.join(known, on="blackbox_id", how="left_anti")
        fresh = fresh.persist(StorageLevel.MEMORY_AND_DISK)
    else:
        fresh = good
    summary.sent = fresh.count()
    summary.already_scheduled = summary.valid - summary.sent
    log.info("sending", rows=summary.sent, already_scheduled=summary.already_scheduled,
             topic=job.intake_topic)  # fmt: skip
    topics.write(intake_records(fresh, caller), job.kafka, job.intake_topic)
    log.info("sent", rows=summary.sent, topic=job.intake_topic)
    if fresh is not good:
        fresh.unpersist()

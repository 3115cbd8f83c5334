"""`blackbox spark schedule`: a dataset of rows becomes schedules on the intake topic.

Read Parquet, CSV or JSON lines exactly (`inputs`); map the user's columns onto the canonical
ones (id, topic, message, key, due, zone); judge every row with the service's own rules
(`rows.Judge`); write the rejects with their reason (a row that could not be read at all is
`malformed_row`, with its raw text); send the good rows to the intake topic as
CALLER_SERVICE, keyed by their id. Ids blackbox already answered `scheduled` or `updated`
for (read from the events topic) are skipped, so a re-run schedules nothing twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import structlog
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blackbox.envelope import CALLER_HEADER, SIGNATURE_HEADER, Header
from blackbox.errors import DeadLetterReason, SettingsError
from blackbox.kafka.events import Outcome
from blackbox.signing import Parts, Signer
from blackbox.spark import inputs, topics
from blackbox.spark.rows import MALFORMED_ROW, DueKind, Judge, MessageKind
from blackbox.tracecontext import TRACEPARENT

log = structlog.get_logger("blackbox.spark.schedule")
_REPEATED = DeadLetterReason.INVALID_ID.value

JUDGED = T.StructType(
    [
        T.StructField("row", T.LongType()),
        T.StructField("id", T.StringType()),
        T.StructField("blackbox_id", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("due_ms", T.LongType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("reason", T.StringType()),
        T.StructField("detail", T.StringType()),
        T.StructField("source", T.StringType()),
        T.StructField("traceparent", T.StringType()),
    ]
)
_ARROW_JUDGED = pa.schema(
    [(f.name, pa.int64() if f.name in ("row", "due_ms") else pa.binary()
      if f.name == "value" else pa.string()) for f in JUDGED.fields]
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
    traceparent: str | None = None  # W3C traceparent of each row, carried to its delivery


@dataclass(frozen=True)
class Shown:
    """One intake record exactly as the job produces it (`--show`)."""

    topic: str
    key: bytes
    headers: tuple[tuple[str, bytes], ...]
    value: bytes

    def line(self) -> str:
        """One JSON line; the value, itself JSON text, is written into it byte for byte."""
        headers = [[name, value.decode("utf-8")] for name, value in self.headers]
        return (
            f'{{"topic": {json.dumps(self.topic)}, "key": {json.dumps(self.key.decode())}, '
            f'"headers": {json.dumps(headers)}, "value": {self.value.decode()}}}'
        )


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
    shown: list[Shown] = field(default_factory=list, repr=False)

    def figures(self) -> dict[str, Any]:
        """The summary as printed: every count (the shown records are printed apart)."""
        figures = {k: v for k, v in vars(self).items() if k != "shown"}
        return figures | {"rejected_total": self.rejected_total}

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


def canonical(
    frame: DataFrame, mapping: Columns, *, blank_is_none: bool = False
) -> tuple[DataFrame, MessageKind, DueKind]:
    """The input with the canonical columns, each row's original kept (`source`): its raw
    text when it could not be read, else its columns as JSON. `blank_is_none` (CSV, where an
    empty field is the only way to say "none"): an empty key or zone is no key or zone."""
    _check_columns(frame, mapping)
    message, kind = _message(frame, mapping)
    due, due_kind = _due(frame, mapping)
    optional = _blank_is_none if blank_is_none else (lambda c: c)
    as_json = F.to_json(F.struct(*[F.col(f"`{c}`") for c in inputs.columns(frame)]))
    source = F.coalesce(F.col(inputs.RAW), as_json)
    selected = frame.select(
        F.monotonically_increasing_id().alias("row"),
        (F.col(f"`{mapping.id}`").cast("string") if mapping.id else F.sha2(source, 256))
        .alias("id"),
        (F.col(f"`{mapping.topic_column}`") if mapping.topic_column else F.lit(mapping.topic))
        .alias("topic"),
        message.alias("message"),
        (optional(F.col(f"`{mapping.key}`").cast("string")) if mapping.key else F.lit(None))
        .alias("key"),
        due.alias("due"),
        (optional(F.col(f"`{mapping.zone}`").cast("string")) if mapping.zone else F.lit(None))
        .alias("zone"),
        F.col(inputs.MALFORMED).alias("malformed"),
        source.alias("source"),
        (optional(F.col(f"`{mapping.traceparent}`").cast("string")) if mapping.traceparent
         else F.lit(None).cast("string")).alias("traceparent"),
    )  # fmt: skip
    return selected, kind, due_kind


def _blank_is_none(column: Column) -> Column:
    return F.when(column != F.lit(""), column)


def _check_columns(frame: DataFrame, mapping: Columns) -> None:
    named = [mapping.id, mapping.topic_column, mapping.message, mapping.key, mapping.due,
             mapping.zone, mapping.traceparent]  # fmt: skip
    have = inputs.columns(frame)
    missing = [c for c in named if c is not None and c not in have]
    if missing:
        raise SettingsError(f"the input has no column {missing[0]!r} (it has {have})")


def _message(frame: DataFrame, mapping: Columns) -> tuple[Column, MessageKind]:
    column = F.col(f"`{mapping.message}`")
    kind = frame.schema[mapping.message].dataType
    if isinstance(kind, T.StructType | T.MapType | T.ArrayType):
        # Every field the struct declares is sent, a null one as null.
        return F.to_json(column, {"ignoreNullFields": "false"}), MessageKind.JSON
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


# What each kind of due column becomes before the Python workers see it. A value that is
# not one (CSV text such as "soon") becomes null, which that row's verdict rejects: a plain
# cast would fail the whole job (Spark's ANSI mode).
_DUE_COLUMNS: dict[str, Callable[[Column], tuple[Column, DueKind]]] = {
    "timestamp": lambda c: (F.unix_millis(c.try_cast("timestamp")), DueKind.AT_MS),
    "epoch_s": lambda c: (F.ceil(c.try_cast("double") * 1000).cast("long"), DueKind.AT_MS),
    "epoch_ms": lambda c: (c.try_cast("long"), DueKind.AT_MS),
    "delay": lambda c: (c.try_cast("double"), DueKind.DELAY),
}


def _wall_clock(frame: DataFrame, name: str, column: Column) -> Column:
    """Local times as text: a timestamp column is read as wall-clock time (session in UTC)."""
    if isinstance(frame.schema[name].dataType, T.TimestampType | T.TimestampNTZType):
        return F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss.SSS")
    return column.cast("string")


# More ids than this appearing twice or more is a mapping mistake (an `--id` column that is
# not the rows' id), not data to judge row by row: the job stops and says so.
MAX_REPEATED_IDS = 100_000


def repeated_ids(rows: DataFrame) -> dict[str, int]:
    """The ids that appear more than once in the canonical `rows`, with their counts: an
    aggregation of the id column alone, so no row is moved to find them."""
    counts = rows.groupBy("id").count().where(F.col("id").isNotNull() & (F.col("count") > 1))
    found = {r["id"]: int(r["count"]) for r in counts.limit(MAX_REPEATED_IDS + 1).collect()}
    if len(found) > MAX_REPEATED_IDS:
        most = max(found, key=found.__getitem__)
        raise SettingsError(
            f"over {MAX_REPEATED_IDS:,} ids appear more than once in the input "
            f"({most!r} {found[most]:,} times): is --id the rows' id?"
        )
    return found


def judged(rows: DataFrame, judge: Judge, now_ms: int, repeated: Mapping[str, int]) -> DataFrame:
    """Every row's verdict, run in the Python workers with the service's own code (rows
    cross in Arrow batches); an id in `repeated` (see `repeated_ids`) is rejected in each of
    its rows. `source` is kept for the rejects only."""

    def verdicts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out = [_verdict(judge, row, now_ms, repeated) for row in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(out, schema=_ARROW_JUDGED)

    return rows.mapInArrow(verdicts, JUDGED)


def _verdict(
    judge: Judge, row: dict[str, Any], now_ms: int, repeated: Mapping[str, int]
) -> dict[str, Any]:
    if row["malformed"] is not None:
        return {"row": row["row"], "reason": MALFORMED_ROW, "detail": row["malformed"],
                "source": row["source"]}  # fmt: skip
    v = judge.row(row, now_ms)
    copies = repeated.get(v.schedule_id or "", 1)
    if v.reason is None and copies > 1:
        v = replace(v, blackbox_id=None, due_ms=None, value=None, reason=_REPEATED,
                    detail=f"the id appears {copies} times in the input")  # fmt: skip
    return {"row": row["row"], "id": v.schedule_id, "blackbox_id": v.blackbox_id,
            "topic": v.topic, "due_ms": v.due_ms, "value": v.value, "reason": v.reason,
            "detail": v.detail, "source": row["source"] if v.reason else None,
            "traceparent": None if v.reason else row.get("traceparent")}  # fmt: skip


def known_ids(
    spark: SparkSession,
    kafka: Mapping[str, str],
    events_topic: str,
    caller: str,
    since_ms: int | None = None,
) -> DataFrame:
    """Stored ids blackbox has answered `scheduled` or `updated` for, for this caller, in the
    events written since `since_ms` (all of them when None); an id may come more than once."""
    schema = "outcome string, caller string, blackbox_id string"
    events = topics.read(spark, kafka, [events_topic], since_ms)
    parsed = events.select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
    answered = F.col("e.outcome").isin(Outcome.SCHEDULED.value, Outcome.UPDATED.value)
    mine = parsed.where(answered & (F.col("e.caller") == caller))
    # Not distinct: an anti-join needs no unique keys, and de-duplicating is one more shuffle.
    return mine.select(F.col("e.blackbox_id").alias("blackbox_id"))


def intake_records(
    good: DataFrame, caller: str, topic: str = "", signing: tuple[bytes, str] | None = None
) -> DataFrame:
    """The intake records of the good rows: keyed by id, CALLER_SERVICE as a header, the
    row's traceparent where it has one, and signed for `topic` with `signing`'s key where
    given (see blackbox.signing)."""
    caller_header = F.struct(F.lit(CALLER_HEADER).alias("key"),
                             F.lit(caller.encode("utf-8")).alias("value"))  # fmt: skip
    trace_header = F.struct(F.lit(TRACEPARENT).alias("key"),
                            F.col("traceparent").cast("binary").alias("value"))  # fmt: skip
    headers = F.when(F.col("traceparent").isNull(), F.array(caller_header)).otherwise(
        F.array(caller_header, trace_header)
    )
    if signing is not None:
        sign = F.udf(_signer(topic, caller, *signing), T.BinaryType(), useArrow=False)
        signature = F.struct(F.lit(SIGNATURE_HEADER).alias("key"),
                             sign(F.col("id"), F.col("value"), F.col("traceparent"))
                             .alias("value"))  # fmt: skip
        headers = F.concat(headers, F.array(signature))
    return good.select(
        F.col("id").cast("binary").alias("key"),
        F.col("value"),
        headers.alias("headers"),
    )


def _signer(
    topic: str, caller: str, pem: bytes, key_id: str
) -> Callable[[str, bytes, str | None], bytes]:
    """A row's signature header value, made on the worker when the row is sent."""
    signed: list[Signer] = []  # made once per worker process, not pickled

    def sign(schedule_id: str, value: bytes, traceparent: str | None) -> bytes:
        if not signed:
            signed.append(Signer.from_pem(pem, key_id))
        headers: list[Header] = [(CALLER_HEADER, caller.encode("utf-8"))]
        if traceparent is not None:
            headers.append((TRACEPARENT, traceparent.encode("utf-8")))
        parts = Parts(topic, schedule_id.encode("utf-8"), bytes(value), headers)
        _, header = signed[0].header(parts, issued_ms=time.time_ns() // 1_000_000)
        return header or b""

    return sign


def first_records(
    good: DataFrame, caller: str, topic: str, count: int, signing: tuple[bytes, str] | None
) -> list[Shown]:
    """The intake records of the first `count` good rows, in input order (a signature is
    made now: the one sent is made when the record is, with its own issue time)."""
    first = intake_records(good.orderBy("row").limit(count), caller, topic, signing).collect()
    return [Shown(topic, bytes(r["key"]),
                  tuple((h["key"], bytes(h["value"])) for h in r["headers"]), bytes(r["value"]))
            for r in first]  # fmt: skip


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
    show: int = 0  # print the intake records of the first N good rows
    since_ms: int | None = None  # read the events topic from here to find known ids
    signing: tuple[bytes, str] | None = None  # a private key (PEM) and its key id


def run(spark: SparkSession, rows: DataFrame, judge: Judge, job: Run) -> Summary:
    """Judge the canonical `rows`, write the rejects, send the good rows; the summary counts
    every row once."""
    started = time.monotonic()
    verdicts = judged(rows, judge, int(time.time() * 1000), repeated_ids(rows))
    verdicts = verdicts.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summary = _count(verdicts, job.dry_run)
        log.info("rows_judged", rows=summary.rows, valid=summary.valid, rejected=summary.rejected)
        if job.rejects is not None:
            _write_rejects(verdicts, job.rejects, job.rejects_format)
        good = verdicts.where(F.col("reason").isNull())
        if job.show > 0:
            summary.shown = first_records(good, judge.caller, job.intake_topic, job.show,
                                          job.signing)  # fmt: skip
        if not job.dry_run:
            _send(spark, good, judge.caller, job, summary)
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
    writer = rejects.write.mode("overwrite").format(fmt)
    if fmt == "csv":  # RFC 4180, as the input: quotes doubled, a header line
        writer = writer.options(header="true", quote='"', escape='"')
    writer.save(path)
    log.info("rejects_written", path=path, format=fmt)


def _send(spark: SparkSession, good: DataFrame, caller: str, job: Run, summary: Summary) -> None:
    fresh, known = good, None
    if job.skip_known:
        known = known_ids(spark, job.kafka, job.events_topic, caller, job.since_ms)
        known = known.persist(StorageLevel.MEMORY_AND_DISK)
        fresh = _unknown(good, known, known.count())
    summary.sent = fresh.count() if fresh is not good else summary.valid
    summary.already_scheduled = summary.valid - summary.sent
    log.info("sending", rows=summary.sent, already_scheduled=summary.already_scheduled,
             topic=job.intake_topic)  # fmt: skip
    records = intake_records(fresh, caller, job.intake_topic, job.signing)
    topics.write(records, job.kafka, job.intake_topic)
    log.info("sent", rows=summary.sent, topic=job.intake_topic)
    if known is not None:
        known.unpersist()


# Up to this many known ids (tens of MB) go to every task: a broadcast join, the good rows
# stay where they are; more, and both sides are shuffled by id.
_BROADCAST_KNOWN = 2_000_000


def _unknown(good: DataFrame, known: DataFrame, count: int) -> DataFrame:
    """The good rows whose id is not among the `count` known ones."""
    if count == 0:  # a first run: nothing to leave out, no join
        return good
    side = F.broadcast(known) if count <= _BROADCAST_KNOWN else known
    return good.join(side, on="blackbox_id", how="left_anti")

"""`blackbox spark audit`: was what was scheduled delivered, on time, once?

Reads the events topic (what blackbox accepted, updated, cancelled, dead-lettered) and the
delivered records of the target topics (their `blackbox-id`, `blackbox-version` and
`blackbox-due-ms` headers) over a window, and finds:

* lost: scheduled in the window, due before its end minus a margin, never delivered, not
  cancelled and not dead-lettered;
* duplicated: one version of an id delivered more than once;
* delivered after a cancel, delivered early (before its due time), late beyond a threshold;
* dead letters by reason; lateness by target topic and caller; deliveries per minute.

Series (recurring schedules) are counted apart, by occurrence (`series.py`): the figures
above are those of one-off schedules, except lateness, early and late, which judge every
delivered record against its own due time.

Each finding is a Parquet table under the output folder; `report.py` draws the HTML report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from blackbox.envelope import CALLER_HEADER
from blackbox.kafka.events import Outcome
from blackbox.metrics import LATENESS_BUCKETS
from blackbox.spark import series, topics

log = structlog.get_logger("blackbox.spark.audit")

EVENT_SCHEMA = (
    "outcome string, caller string, id string, blackbox_id string, due_ms long, topic string, "
    "reason string, at_ms long, intake struct<topic:string, partition:long, offset:long>, "
    "occurrence_ms long"
)
PERCENTILES = (0.5, 0.9, 0.99)
_MINUTE_MS = 60_000


@dataclass(frozen=True)
class Window:
    """The audited span (epoch ms), and how long after a due time a message may still be
    on its way without counting as lost."""

    since_ms: int
    until_ms: int
    margin_ms: int = 60_000

    @property
    def due_cutoff_ms(self) -> int:
        return self.until_ms - self.margin_ms


@dataclass
class Findings:
    """The audit's figures; `tables` holds the small aggregates the report draws."""

    counts: dict[str, int] = field(default_factory=dict)
    series: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    lateness_buckets: list[tuple[float, int]] = field(default_factory=list)
    lateness_ms: dict[str, float | None] = field(default_factory=dict)
    by_target: list[dict[str, Any]] = field(default_factory=list)
    per_minute: list[dict[str, Any]] = field(default_factory=list)

    def failed(self) -> bool:
        """Whether the audit should fail a scheduled check: anything lost or too late."""
        lost = self.counts.get("lost", 0) + self.series.get("lost", 0)
        return lost > 0 or self.counts.get("late", 0) > 0


def read_events(
    spark: SparkSession, kafka: Mapping[str, str], topic: str, window: Window
) -> DataFrame:
    """The answers blackbox gave within the window, one row each."""
    raw = topics.read(spark, kafka, [topic], window.since_ms)
    text = F.col("value").cast("string")
    events = raw.select(F.from_json(text, EVENT_SCHEMA).alias("e")).select("e.*")
    return events.where(F.col("at_ms").between(window.since_ms, window.until_ms))


def read_deliveries(
    spark: SparkSession, kafka: Mapping[str, str], targets: Sequence[str], since_ms: int
) -> DataFrame:
    """Every record blackbox delivered to `targets` since the window opened (to now)."""
    raw = topics.read(spark, kafka, targets, since_ms)
    delivered = raw.select(
        topics.header("blackbox-id").alias("blackbox_id"),
        topics.header("blackbox-version").alias("version"),
        topics.header("blackbox-due-ms").cast("long").alias("due_ms"),
        topics.header("blackbox-occurrence-ms").cast("long").alias("occurrence_ms"),
        topics.header(CALLER_HEADER).alias("caller"),
        "topic", "partition", "offset",
        topics.millis().alias("delivered_ms"),
    )  # fmt: skip
    delivered = delivered.where(F.col("blackbox_id").isNotNull())
    return delivered.withColumn("lateness_ms", F.col("delivered_ms") - F.col("due_ms"))


def target_topics(events: DataFrame) -> list[str]:
    """The topics the window's schedules target, and those its series' occurrences went to
    (a series may have been scheduled long before the window)."""
    told = (*_SCHEDULED, Outcome.FIRED.value)
    scheduled = events.where(F.col("outcome").isin(*told)).select("topic").distinct()
    return sorted(r["topic"] for r in scheduled.collect() if r["topic"])


_SCHEDULED = (Outcome.SCHEDULED.value, Outcome.UPDATED.value)


def schedules(events: DataFrame) -> DataFrame:
    """Each scheduled id once, as its latest version left it."""
    latest = events.where(F.col("outcome").isin(*_SCHEDULED))
    version = F.concat_ws(":", "intake.topic", "intake.partition", "intake.offset")
    latest = latest.withColumn("version", version)
    return latest.groupBy("blackbox_id").agg(
        *[F.max_by(c, "at_ms").alias(c) for c in ("caller", "topic", "due_ms", "version")],
        F.max("at_ms").alias("scheduled_ms"),
    )


def cancels(events: DataFrame) -> DataFrame:
    cancelled = events.where(F.col("outcome") == Outcome.CANCELLED.value)
    return cancelled.groupBy("blackbox_id").agg(F.min("at_ms").alias("cancelled_ms"))


def dead_letters(events: DataFrame) -> DataFrame:
    dead = events.where(F.col("outcome") == Outcome.DEAD_LETTERED.value)
    return dead.select("blackbox_id", "caller", "id", "topic", "reason", "at_ms")


def lost(scheduled: DataFrame, delivered: DataFrame, cancelled: DataFrame, dead: DataFrame,
         window: Window) -> DataFrame:  # fmt: skip
    """Due before the cutoff, and neither delivered, cancelled nor dead-lettered."""
    due = scheduled.where(F.col("due_ms") < window.due_cutoff_ms)
    for done in (delivered, cancelled, dead.where(F.col("blackbox_id").isNotNull())):
        due = due.join(done.select("blackbox_id").distinct(), "blackbox_id", "left_anti")
    return due


def duplicates(delivered: DataFrame) -> DataFrame:
    """Versions of one-off schedules delivered more than once, with how many copies."""
    copies = (
        delivered.where(~series.recurring(delivered))
        .groupBy("blackbox_id", "version", "topic")
        .agg(F.count(F.lit(1)).alias("copies"), F.min("delivered_ms").alias("first_ms"))
    )
    return copies.where(F.col("copies") > 1)


def after_cancel(delivered: DataFrame, cancelled: DataFrame) -> DataFrame:
    joined = delivered.join(cancelled, "blackbox_id")
    return joined.where(F.col("delivered_ms") > F.col("cancelled_ms"))


def lateness_buckets(delivered: DataFrame) -> list[tuple[float, int]]:
    """Cumulative counts at the service's own histogram bounds (seconds), +Inf last."""
    bounds = [*LATENESS_BUCKETS, float("inf")]
    sums = [
        F.sum(F.when(F.col("lateness_ms") <= b * 1000, 1).otherwise(0)).alias(f"b{i}")
        for i, b in enumerate(bounds)
    ]
    row = delivered.agg(*sums).first()
    return [(b, int((row[f"b{i}"] if row else 0) or 0)) for i, b in enumerate(bounds)]


def lateness_summary(delivered: DataFrame) -> dict[str, float | None]:
    quantiles = F.percentile_approx("lateness_ms", list(PERCENTILES), 10_000)
    row = delivered.agg(quantiles.alias("q"), F.max("lateness_ms").alias("max")).first()
    values: list[float | None] = list(row["q"] or [None] * 3) if row else [None] * 3
    summary = {f"p{round(p * 100)}": v for p, v in zip(PERCENTILES, values, strict=True)}
    return {**summary, "max": row["max"] if row else None}


def by_target(delivered: DataFrame) -> DataFrame:
    """Lateness percentiles (ms) per target topic and caller."""
    quantiles = F.percentile_approx("lateness_ms", list(PERCENTILES), 10_000)
    grouped = delivered.groupBy("topic", "caller").agg(
        F.count(F.lit(1)).alias("deliveries"), quantiles.alias("q"),
        F.max("lateness_ms").alias("max_ms"),
    )  # fmt: skip
    named = [F.col("q")[i].alias(f"p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)]
    return grouped.select("topic", "caller", "deliveries", *named, "max_ms").orderBy("topic")


def per_minute(scheduled: DataFrame, fired: DataFrame, delivered: DataFrame) -> DataFrame:
    """Deliveries per minute against what fell due in that minute (one-off schedules, and
    series' occurrences announced fired)."""
    minute = (F.col("t") / _MINUTE_MS).cast("long") * _MINUTE_MS
    dues = scheduled.select(F.col("due_ms").alias("t")).union(fired.select("due_ms"))
    due = dues.groupBy(minute.alias("minute_ms"))
    done = delivered.select(F.col("delivered_ms").alias("t")).groupBy(minute.alias("minute_ms"))
    joined = due.agg(F.count(F.lit(1)).alias("due")).join(
        done.agg(F.count(F.lit(1)).alias("delivered")), "minute_ms", "full_outer"
    )
    return joined.na.fill(0).orderBy("minute_ms")


@dataclass(frozen=True)
class Audit:
    """One audit's inputs."""

    kafka: Mapping[str, str]
    events_topic: str
    window: Window
    out: str
    targets: Sequence[str] = ()  # empty: the topics the window's schedules target
    max_late_ms: int | None = None


def run(spark: SparkSession, audit: Audit) -> Findings:
    """Read, find, write every table under `audit.out`; the figures come back."""
    events = read_events(spark, audit.kafka, audit.events_topic, audit.window)
    events = events.persist(StorageLevel.MEMORY_AND_DISK)
    targets = list(audit.targets) or target_topics(events)
    log.info("audit_reading", events_topic=audit.events_topic, targets=targets)
    delivered = _deliveries(spark, audit, targets).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _find(events, delivered, audit, targets)
    finally:
        delivered.unpersist()
        events.unpersist()


def _deliveries(spark: SparkSession, audit: Audit, targets: Sequence[str]) -> DataFrame:
    if not targets:
        schema = "blackbox_id string, version string, due_ms long, occurrence_ms long, " \
                 "caller string, topic string, partition int, offset long, delivered_ms long, " \
                 "lateness_ms long"  # fmt: skip
        return spark.createDataFrame([], schema)
    return read_deliveries(spark, audit.kafka, targets, audit.window.since_ms)


def _find(
    events: DataFrame, delivered: DataFrame, audit: Audit, targets: Sequence[str]
) -> Findings:
    cancelled, dead = cancels(events), dead_letters(events)
    recurring = series.ids(events, delivered)
    scheduled = schedules(events).join(recurring, "blackbox_id", "left_anti")
    fired = series.fired(events, targets, audit.window.since_ms)
    tables = {
        "deliveries": delivered,
        "schedules": scheduled,
        "lost": lost(scheduled, delivered, cancelled, dead, audit.window),
        "duplicates": duplicates(delivered),
        **_series_tables(recurring, delivered, fired),
        "after_cancel": after_cancel(delivered, cancelled),
        "early": delivered.where(F.col("lateness_ms") < 0),
        "late": delivered.where(F.col("lateness_ms") > (audit.max_late_ms or 0))
        if audit.max_late_ms is not None else delivered.limit(0),
        "dead_letters": dead,
        "lateness_by_target": by_target(delivered),
        "per_minute": per_minute(scheduled, fired, delivered),
    }  # fmt: skip
    for name, table in tables.items():
        table.write.mode("overwrite").parquet(f"{audit.out}/{name}")
    return _figures(tables, delivered, audit)


def _series_tables(
    recurring: DataFrame, delivered: DataFrame, fired: DataFrame
) -> dict[str, DataFrame]:
    missing = series.lost(fired, delivered)
    return {
        "series": series.per_series(recurring, delivered, fired, missing),
        "series_duplicates": series.duplicates(delivered),
        "series_lost": missing,
    }


def _figures(tables: dict[str, DataFrame], delivered: DataFrame, audit: Audit) -> Findings:
    """The counts, read back from the tables just written (each computed once)."""
    spark = delivered.sparkSession
    written = {n: spark.read.parquet(f"{audit.out}/{n}") for n in tables}
    counts = {n: written[n].count() for n in ("schedules", "lost", "after_cancel", "early",
                                               "late", "dead_letters")}  # fmt: skip
    dupes = written["duplicates"].agg(F.count(F.lit(1)), F.sum(F.col("copies") - 1)).first()
    deliveries = written["deliveries"]
    one_off = deliveries.where(~series.recurring(deliveries))
    counts |= {
        "scheduled": counts.pop("schedules"),
        "deliveries": one_off.count(),
        "delivered": one_off.select("blackbox_id").distinct().count(),
        "duplicated": int(dupes[0] or 0) if dupes else 0,
        "extra_copies": int(dupes[1] or 0) if dupes else 0,
    }
    reasons = written["dead_letters"].groupBy("reason").count().collect()
    return Findings(
        counts=counts,
        series=_series_figures(written["series"]),
        dead_letters={r["reason"]: int(r["count"]) for r in reasons},
        lateness_buckets=lateness_buckets(deliveries),
        lateness_ms=lateness_summary(deliveries),
        by_target=[r.asDict() for r in written["lateness_by_target"].collect()],
        per_minute=[r.asDict() for r in written["per_minute"].collect()],
    )


def _series_figures(per_series: DataFrame) -> dict[str, int]:
    """The series' totals, from their table: series, occurrences delivered and announced,
    records, duplicated and lost occurrences, extra copies."""
    names = ("occurrences", "deliveries", "duplicated", "fired", "lost")
    row = per_series.agg(F.count(F.lit(1)).alias("series"),
                         *[F.sum(n).alias(n) for n in names]).first()  # fmt: skip
    figures = {n: int((row[n] if row else 0) or 0) for n in ("series", *names)}
    return figures | {"extra_copies": figures["deliveries"] - figures["occurrences"]}

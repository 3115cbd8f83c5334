"""The audit of recurring schedules (series): each occurrence is its own unit of account.

A series is one id delivered many times, once per occurrence, each record carrying the
nominal occurrence in its `blackbox-occurrence-ms` header. So the audit counts a series by
(blackbox-id, occurrence-ms): an occurrence delivered once is on time or late (from its own
`blackbox-due-ms`), delivered twice is a duplicate of that occurrence, and the series'
second occurrence is never a duplicate of its first. An occurrence is lost when the events
topic announced it `fired` (blackbox saw the broker acknowledge it) but the target topic
does not hold it.

An id is a series when one of its deliveries carries an occurrence, or when the events
topic says something only a series is told (`fired`, `completed`, `paused`, `resumed`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from blackbox.kafka.events import Outcome

OCCURRENCE = ("blackbox_id", "occurrence_ms")
# Outcomes the events topic reports only about a series.
_SERIES_ONLY = (Outcome.FIRED.value, Outcome.COMPLETED.value, Outcome.PAUSED.value,
                Outcome.RESUMED.value)  # fmt: skip


def recurring(delivered: DataFrame) -> Column:
    """Whether a delivered record is an occurrence of a series."""
    return delivered["occurrence_ms"].isNotNull()


def ids(events: DataFrame, delivered: DataFrame) -> DataFrame:
    """The series' ids (one column, `blackbox_id`), each once."""
    told = events.where(F.col("outcome").isin(*_SERIES_ONLY)).select("blackbox_id")
    occurred = delivered.where(recurring(delivered)).select("blackbox_id")
    return told.union(occurred).where(F.col("blackbox_id").isNotNull()).distinct()


def fired(events: DataFrame, targets: Sequence[str], since_ms: int) -> DataFrame:
    """Occurrences the events topic announced delivered, each once: those due within the
    window (their record is then no older than the window, so the audit read it) to the
    audited targets."""
    announced = events.where(
        (F.col("outcome") == Outcome.FIRED.value)
        & F.col("occurrence_ms").isNotNull()
        & (F.col("due_ms") >= since_ms)
        & F.col("topic").isin(*targets)
    )
    return announced.groupBy(*OCCURRENCE).agg(
        *[F.first(c).alias(c) for c in ("caller", "topic", "due_ms")],
        F.min("at_ms").alias("fired_ms"),
    )


def lost(announced: DataFrame, delivered: DataFrame) -> DataFrame:
    """Occurrences announced fired that no target topic holds."""
    held = delivered.where(recurring(delivered)).select(*OCCURRENCE).distinct()
    return announced.join(held, list(OCCURRENCE), "left_anti")


def duplicates(delivered: DataFrame) -> DataFrame:
    """Occurrences delivered more than once, with how many copies."""
    occurrences = delivered.where(recurring(delivered))
    copies = occurrences.groupBy(*OCCURRENCE, "topic").agg(
        F.count(F.lit(1)).alias("copies"), F.min("delivered_ms").alias("first_ms")
    )
    return copies.where(F.col("copies") > 1)


def per_series(
    series: DataFrame, delivered: DataFrame, announced: DataFrame, missing: DataFrame
) -> DataFrame:
    """One row per series: its occurrences delivered, copies, duplicated and lost ones."""
    occurrences = delivered.where(recurring(delivered))
    once = occurrences.groupBy(*OCCURRENCE).agg(
        F.count(F.lit(1)).alias("n"), F.first("topic").alias("topic"),
        F.first("caller").alias("caller"),
    )  # fmt: skip
    shipped = once.groupBy("blackbox_id").agg(
        F.first("topic").alias("topic"), F.first("caller").alias("caller"),
        F.count(F.lit(1)).alias("occurrences"), F.sum("n").alias("deliveries"),
        F.sum(F.when(F.col("n") > 1, 1).otherwise(0)).alias("duplicated"),
        F.min("occurrence_ms").alias("first_occurrence_ms"),
        F.max("occurrence_ms").alias("last_occurrence_ms"),
    )  # fmt: skip
    told = announced.groupBy("blackbox_id").agg(F.count(F.lit(1)).alias("fired"))
    gone = missing.groupBy("blackbox_id").agg(F.count(F.lit(1)).alias("lost"))
    joined = series.join(shipped, "blackbox_id", "left")
    for part in (told, gone):
        joined = joined.join(part, "blackbox_id", "left")
    counts = ("occurrences", "deliveries", "duplicated", "fired", "lost")
    return joined.na.fill(0, list(counts)).orderBy("blackbox_id")

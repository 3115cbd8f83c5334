"""Kafka through Spark's own connector: batch reads with headers, batch writes with them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F


def options(kafka: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The connector's `kafka.*` options: the service's bootstrap servers, plus NAME=VALUE
    Java client properties (security settings differ between librdkafka and Java)."""
    chosen = {"kafka.bootstrap.servers": kafka["bootstrap.servers"]}
    for item in extra:
        name, _, value = item.partition("=")
        chosen[f"kafka.{name}"] = value
    return chosen


def read(
    spark: SparkSession, kafka: Mapping[str, str], topics: Sequence[str], since_ms: int | None
) -> DataFrame:
    """Every record of `topics` from `since_ms` (or the start) to their current end."""
    reader = spark.read.format("kafka").options(**kafka)
    reader = reader.option("subscribe", ",".join(topics)).option("includeHeaders", "true")
    reader = reader.option("endingOffsets", "latest").option("failOnDataLoss", "false")
    if since_ms is None:
        return reader.option("startingOffsets", "earliest").load()
    reader = reader.option("startingTimestamp", str(since_ms))
    return reader.option("startingOffsetsByTimestampStrategy", "latest").load()


def header(name: str) -> Column:
    """The first value of header `name` as text, null when the record has none."""
    matching = F.filter("headers", lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matching, F.lit(1))["value"].cast("string")


def millis(column: str = "timestamp") -> Column:
    """A timestamp column as epoch milliseconds."""
    return F.unix_millis(F.col(column))


def write(frame: DataFrame, kafka: Mapping[str, str], topic: str) -> None:
    """Produce `frame` (key, value, headers) to `topic`, acknowledged by all replicas."""
    writer = frame.write.format("kafka").options(**kafka).option("topic", topic)
    writer = writer.option("kafka.linger.ms", "20").option("kafka.batch.size", "262144")
    writer.option("kafka.acks", "all").save()

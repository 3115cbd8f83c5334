"""An example dataset for `blackbox spark schedule`, with some bad rows on purpose.

    python -m blackbox.spark.example --rows 100000 --out users.parquet

Each row is a user to act on later: `user_id`, `topic` (two target topics), `payload` (a
struct, delivered as JSON), `delay_s` (seconds from now), and `local_time` with `zone` (a
wall-clock time in the user's zone, for "9:00 in each user's time zone"). Every
`bad_every`-th row is bad in one of four ways, in turn; `expected_rejects` counts them
when the due time is `delay_s` (a negative delay is one of the four).
"""

from __future__ import annotations

import argparse
from collections import Counter

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

ZONES = ("Europe/Paris", "America/New_York", "Asia/Tokyo", "Australia/Sydney", "UTC")
# The four ways a row is bad, in turn, and the reason blackbox gives for each.
BAD_KINDS = ("forbidden_topic", "invalid_countdown", "invalid_id", "invalid_topic")


def dataset(  # noqa: PLR0913 - the dataset's knobs, each by name
    spark: SparkSession,
    rows: int,
    *,
    bad_every: int = 100,
    prefix: str = "users",
    max_delay_s: float = 5.0,
    min_delay_s: float = 1.0,
) -> DataFrame:
    """`rows` rows; delays spread over [min_delay_s, min_delay_s + max_delay_s) seconds."""
    i = F.col("id")
    bad = (i % bad_every == 0) if bad_every else F.lit(False)
    kind = (i / bad_every).cast("long") % len(BAD_KINDS) if bad_every else F.lit(-1)
    topic = F.when(i % 2 == 0, F.lit(f"{prefix}.erase")).otherwise(F.lit(f"{prefix}.notify"))
    zones = F.array(*[F.lit(z) for z in ZONES])
    return spark.range(rows).select(
        F.when(bad & (kind == 2), F.lit(None)).otherwise(F.format_string("user-%08d", i))
        .alias("user_id"),
        F.when(bad & (kind == 0), F.lit("__consumer_offsets"))
        .when(bad & (kind == 3), F.lit("not a topic")).otherwise(topic).alias("topic"),
        F.struct(F.format_string("user-%08d", i).alias("user"),
                 F.when(i % 2 == 0, "erase").otherwise("notify").alias("action")).alias("payload"),
        F.when(bad & (kind == 1), F.lit(-1.0))
        .otherwise(min_delay_s + (i * 7919 % 1000) / 1000 * max_delay_s).alias("delay_s"),
        F.lit("2026-11-24 09:00:00").alias("local_time"),
        F.element_at(zones, (i % len(ZONES) + 1).cast("int")).alias("zone"),
    )  # fmt: skip


def expected_rejects(rows: int, bad_every: int = 100) -> dict[str, int]:
    """How many rows of `dataset(rows, bad_every)` are rejected, by reason."""
    if not bad_every:
        return {}
    kinds = Counter(BAD_KINDS[(n // bad_every) % len(BAD_KINDS)]
                    for n in range(0, rows, bad_every))  # fmt: skip
    return dict(sorted(kinds.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--bad-every", type=int, default=100, help="0: no bad rows")
    parser.add_argument("--prefix", default="users", help="target topics PREFIX.erase/.notify")
    parser.add_argument("--format", choices=("parquet", "csv", "json"), default="parquet")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from blackbox.spark import session  # noqa: PLC0415

    spark = session.start(app="blackbox-example")
    frame = dataset(spark, args.rows, bad_every=args.bad_every, prefix=args.prefix)
    if args.format != "parquet":  # CSV holds no struct: the payload goes as JSON text
        frame = frame.withColumn("payload", F.to_json("payload"))
    writer = frame.write.mode("overwrite").format(args.format)
    # CSV only: a header line, and quotes doubled (RFC 4180) rather than Spark's backslash.
    writer.options(header="true", quote='"', escape='"').save(args.out)
    expected = expected_rejects(args.rows, args.bad_every)
    print(f"{args.rows:,} rows in {args.out}; rejects expected: {expected}")  # noqa: T201
    spark.stop()


if __name__ == "__main__":
    main()

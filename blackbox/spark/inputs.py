"""The schedule job's input, read exactly as the file says: CSV, JSON lines or Parquet.

- CSV (RFC 4180): every column is a string, as written (`000123` stays `000123`); the file's
  encoding is stated (UTF-8 by default; a byte order mark is dropped); each file starts with
  a header line naming its columns. Spark finds where each record ends (a quoted field may
  hold line breaks) and hands over its raw text; `csvrecords` splits that text exactly.
- JSON lines: each column keeps the type Spark infers, except the message column, which is
  read as the exact JSON text of its value (key order, spacing, numbers as written).
- Parquet: its own types.

Every format gives two more columns: MALFORMED (why the row could not be read, else null)
and RAW (the row's raw text when it could not). A malformed row is never padded or cut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from blackbox.errors import SettingsError
from blackbox.spark import csvrecords

MALFORMED = "_blackbox_malformed"
RAW = "_blackbox_raw"
_CORRUPT = "_blackbox_corrupt"
_PATH = "_blackbox_path"
FORMATS = ("parquet", "csv", "json")


@dataclass(frozen=True)
class Source:
    """Where the rows are and how they are written."""

    paths: Sequence[str]
    format: str | None = None  # None: by the first path's suffix
    encoding: str = "UTF-8"

    @property
    def kind(self) -> str:
        name = self.paths[0].lower().rstrip("/*")
        if self.format is not None:
            return self.format
        if name.endswith(".csv"):
            return "csv"
        return "json" if name.endswith((".json", ".jsonl")) else "parquet"


def read(spark: SparkSession, source: Source, message: str | None = None) -> DataFrame:
    """The rows of `source` with MALFORMED and RAW; `message` names the message column."""
    charsets = spark.sparkContext._jvm.java.nio.charset.Charset  # type: ignore[union-attr]
    if not charsets.isSupported(source.encoding):
        raise SettingsError(f"--encoding {source.encoding!r} is not an encoding Java knows")
    readers = {"csv": _csv, "json": _json, "parquet": _parquet}
    return readers[source.kind](spark, source, message)


def columns(frame: DataFrame) -> list[str]:
    """The input's own columns (MALFORMED and RAW left out)."""
    return [c for c in frame.columns if c not in (MALFORMED, RAW)]


def _parquet(spark: SparkSession, source: Source, _message: str | None) -> DataFrame:
    return _all_readable(spark.read.parquet(*source.paths))


def _all_readable(frame: DataFrame) -> DataFrame:
    nothing = F.lit(None).cast("string")
    return frame.withColumns({MALFORMED: nothing, RAW: nothing})


def _json(spark: SparkSession, source: Source, message: str | None) -> DataFrame:
    reader = spark.read.option("columnNameOfCorruptRecord", _CORRUPT)
    if source.encoding.replace("-", "").lower() != "utf8":
        # Only then: with the option set, Spark decodes to characters first and an object
        # read as a string comes back re-generated (compact), not as the file's own text.
        reader = reader.option("encoding", source.encoding)
    frame = reader.json(list(source.paths))
    if message in frame.columns and frame.schema[message].dataType != T.StringType():
        # A string field holding an object or a number gives that value's JSON text as
        # written in the file (Spark 4), where a struct would sort and drop its keys.
        exact = [T.StructField(f.name, T.StringType()) if f.name == message else f
                 for f in frame.schema.fields]  # fmt: skip
        frame = reader.schema(T.StructType(exact)).json(list(source.paths))
    if _CORRUPT not in frame.columns:  # inference read every line: none was malformed
        return _all_readable(frame)
    bad = F.col(_CORRUPT).isNotNull()
    return frame.withColumns({
        MALFORMED: F.when(bad, F.lit("the line is not one JSON object")),
        RAW: F.col(_CORRUPT),
    }).drop(_CORRUPT)  # fmt: skip


def _csv(spark: SparkSession, source: Source, _message: str | None) -> DataFrame:
    names = _header(spark, source)
    clash = {MALFORMED, RAW} & set(names)
    if clash:
        raise SettingsError(f"the CSV header names the reserved column {clash.pop()!r}")
    # Spark gives a record's raw text only when its field count differs from the schema's,
    # so the schema has one column (two when the header has one): every record but those of
    # exactly that many fields then comes with its raw text, and those are rebuilt.
    width = 2 if len(names) == 1 else 1
    records = _records(spark, source, width)
    out = T.StructType([T.StructField(n, T.StringType()) for n in [*names, MALFORMED, RAW]])
    return records.mapInArrow(_parser(names, width), out)


def _header(spark: SparkSession, source: Source) -> list[str]:
    first = _records(spark, source, 1).first()
    if first is None:
        raise SettingsError(f"the CSV input {list(source.paths)} holds no header line")
    try:
        return csvrecords.header(_raw(first.asDict(), 1) or "")
    except csvrecords.MalformedRecord as e:
        raise SettingsError(f"the CSV header line of {first[_PATH]} cannot be read: {e}") from e


def _records(spark: SparkSession, source: Source, width: int) -> DataFrame:
    """Each CSV record with its raw text (when Spark gives it) and its file, in file order."""
    tokens = [f"_c{i}" for i in range(width)]
    schema = T.StructType([T.StructField(n, T.StringType()) for n in [*tokens, _CORRUPT]])
    # lineSep: a record ends at LF or CRLF (the CR is left out of its text), in one file as in
    # another; Spark otherwise takes the first line's ending for the whole file, and a file
    # with both would read whole blocks of lines as one record.
    reader = spark.read.schema(schema).options(
        header="false", multiLine="true", quote='"', escape='"', lineSep="\n",
        encoding=source.encoding, mode="PERMISSIVE", columnNameOfCorruptRecord=_CORRUPT,
    )  # fmt: skip
    frame = reader.csv(list(source.paths))
    return frame.select(*tokens, _CORRUPT, F.col("_metadata.file_path").alias(_PATH))


def _raw(record: dict[str, str | None], width: int) -> str | None:
    """The record's raw text; None for a blank line (Spark skips LF ones, not CRLF ones)."""
    raw = record[_CORRUPT]
    if raw is not None:
        return raw
    tokens = [record[f"_c{i}"] for i in range(width)]
    return None if tokens[0] == "\r" and set(tokens[1:]) <= {None} else csvrecords.rebuilt(tokens)


def _parser(
    names: list[str], width: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    schema = pa.schema([(n, pa.string()) for n in [*names, MALFORMED, RAW]])

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        records = csvrecords.Records(names, MALFORMED, RAW)  # one per partition: whole files
        for batch in batches:
            raw = [(_raw(r, width), r[_PATH]) for r in batch.to_pylist()]
            lines = [(text, path) for text, path in raw if text is not None]
            yield pa.RecordBatch.from_pylist(list(records.rows(lines)), schema=schema)

    return parse

"""Bulk scheduling sends exactly what the user's file says (guarantee 9), end to end.

Files written as people write them (Python's csv module, pandas, a spreadsheet, JSON lines,
Parquet) go through `blackbox spark schedule` on the shared Spark session; every record the
service delivers is compared, byte for byte, with its source row.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pandas as pd  # type: ignore[import-untyped]  # no stubs; Spark's extra brings it
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from blackbox.cli import main as cli
from blackbox.exits import EXIT_OK
from blackbox.kafka import clients
from blackbox.spark.rows import rfc3339
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.integration.test_spark import job_env, spark  # noqa: F401 - the shared fixtures
from tests.kafkatools import Received, TopicReader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

COLUMNS = ["user_id", "topic", "payload", "due_ms", "key"]
# Cells that a reader with Spark's defaults, or one that guesses, gets wrong.
PAYLOADS = [
    '{"user": 0, "text": "é✓ rappel, \\"quoted\\""}',
    "a, b, c",
    'say "hi", then "bye"',
    "line 1\nline 2",
    "line 1\r\nline 2\r\n",
    "  padded  ",
    "000123",
    "NULL",
    "#not a comment",
    'tab\there; back\\slash \\"',
    "🙂 ünïcödé",
    "x" * 3000,
]
# Planted malformed records, each a reject with its raw text (the last swallows the line
# after it: a quote never closed runs to the end of its file).
BROKEN = [
    "b0001,{topic},too,many,1,k",
    "b0002,{topic},few",
    'b0003,{topic},"an "unescaped" quote",1,k',
    'b0004,{topic},"{{\\"backslash\\": \\"escaped\\"}}",1,k',
    'b0005,{topic},stray "quote,1,k',
    'b0006,{topic},"never closed,1,k\nb0007,{topic},swallowed,1,k',
]


def rows(file: int, count: int, topic: str, first_due_ms: int) -> list[dict[str, str]]:
    """`count` rows: ids and keys with leading zeros, every hard payload, some keys blank."""
    return [{"user_id": f"0{file}{i:04d}", "topic": topic,
             "payload": PAYLOADS[i % len(PAYLOADS)] + (f" #{i}" if i % 5 else ""),
             "due_ms": str(first_due_ms + i), "key": "" if i % 4 == 0 else f"00{i % 7}"}
            for i in range(count)]  # fmt: skip


def write_python_csv(path: Path, table: list[dict[str, str]]) -> None:
    """Python's csv module, its defaults: CRLF, a field quoted when it must be."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(table)


def write_pandas_csv(path: Path, table: list[dict[str, str]]) -> None:
    """pandas' to_csv: LF, its own column order, due times as numbers, blank keys as NaN."""
    frame = pd.DataFrame(table)[["payload", "user_id", "key", "due_ms", "topic"]]
    frame["due_ms"] = frame["due_ms"].astype("int64")
    frame["key"] = frame["key"].replace("", None)
    frame.to_csv(path, index=False)


def write_spreadsheet_csv(path: Path, table: list[dict[str, str]]) -> None:
    """As a spreadsheet saves "CSV UTF-8": a byte order mark, CRLF, every text cell quoted,
    line breaks inside cells, a blank line at the end."""
    with path.open("w", newline="", encoding="utf-8-sig") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
        writer.writerow(COLUMNS)
        writer.writerows([[r[c] for c in COLUMNS] for r in table])
        f.write("\r\n")


def write_broken_csv(path: Path, table: list[dict[str, str]], topic: str) -> list[str]:
    """Good rows, then the planted malformed records; returns their raw texts."""
    write_python_csv(path, table)
    planted = [b.format(topic=topic) for b in BROKEN]
    with path.open("a", newline="", encoding="utf-8") as f:
        f.write("\n".join(planted) + "\n")
    return planted


# Due times this far ahead of the test's start: blackbox delivers a due time already past at
# intake at once, with that instant as its due header, so the file's own due must still be
# ahead when the job's records reach the service.
AHEAD_MS = 60_000


def assert_still_ahead(due_ms: int) -> None:
    """The job finished before the first due time (else the due headers cannot match)."""
    left = due_ms - time.time() * 1000
    assert left > 5000, f"the job ran to {-left / 1000:.0f} s before due: raise AHEAD_MS"


def schedule(*args: str) -> int:
    return cli.main(["spark", "schedule", "--caller", "files", "--id", "user_id", *args])


def delivered_all(topic: TopicReader, count: int) -> list[Received]:
    """The `count` records expected, and any copy produced after them."""
    topic.wait_count(count, timeout=240)
    return topic.read_to_end()


def check_delivered(
    delivered: list[Received], table: list[dict[str, Any]], caller: str, value_of: Any
) -> None:
    """Every source row delivered once, its value, key and headers exactly its own."""
    by_id = {r["user_id"]: r for r in table}
    seen = [r.header("blackbox-id").removeprefix(f"@{caller}/") for r in delivered]
    assert sorted(seen) == sorted(by_id), "each row delivered exactly once"
    for record, schedule_id in zip(delivered, seen, strict=True):
        row = by_id[schedule_id]
        assert record.value == value_of(row), schedule_id
        assert record.key == (row["key"].encode() if row["key"] else None), schedule_id
        assert record.headers["CALLER_SERVICE"] == caller.encode()
        assert [h for h in record.headers if not h.startswith("blackbox-")] == ["CALLER_SERVICE"]
        assert record.headers["blackbox-due-ms"] == str(row["due_ms"]).encode()


def test_csv_from_python_pandas_and_a_spreadsheet_is_delivered_byte_for_byte(
    spark: SparkSession,  # noqa: F811
    job_env: dict[str, str],  # noqa: F811
    start_service: ServiceFactory,
    reader: ReaderFactory,
    tmp_path: Path,
) -> None:
    """Guarantee 9 (and 1): CSV written by Python's csv module, by pandas (other column
    order) and as a spreadsheet saves it (BOM, CRLF, all quoted, line breaks in cells) is
    read as written: every delivered record's value, key and headers are its row's, ids and
    keys keep their leading zeros, a blank key is no key; malformed records (wrong field
    count, broken quoting) are rejects `malformed_row` with their raw text, counted."""
    topic = f"{job_env['BLACKBOX_NAMESPACE']}.files"
    due = int(time.time() * 1000) + AHEAD_MS
    tables = [rows(n, 120, topic, due + 1000 * n) for n in range(4)]
    data = tmp_path / "in"
    data.mkdir()
    write_python_csv(data / "python.csv", tables[0])
    write_pandas_csv(data / "pandas.csv", tables[1])
    write_spreadsheet_csv(data / "spreadsheet.csv", tables[2])
    planted = write_broken_csv(data / "broken.csv", tables[3], topic)
    good = [row for table in tables for row in table]
    start_service()
    summary = tmp_path / "summary.json"
    code = schedule(str(data / "*.csv"), "--topic-column", "topic", "--message", "payload",
                    "--key", "key", "--due", "due_ms", "--due-as", "epoch_ms",
                    "--rejects", str(tmp_path / "rejects"), "--summary", str(summary))  # fmt: skip
    assert code == EXIT_OK
    assert_still_ahead(due)
    counts = json.loads(summary.read_text())
    assert counts["rejected"] == {"malformed_row": len(planted)}
    assert (counts["rows"], counts["sent"]) == (len(good) + len(planted), len(good))
    rejects = spark.read.json(str(tmp_path / "rejects")).collect()
    assert sorted(r["source"] for r in rejects) == sorted(planted)
    assert all(r["reason"] == "malformed_row" and r["detail"] for r in rejects)

    delivered = delivered_all(reader(topic), len(good))  # once due
    check_delivered(delivered, good, "files", lambda row: row["payload"].encode())


def test_dry_run_shows_the_records_exactly_as_they_are_then_produced(
    spark: SparkSession,  # noqa: F811 - the session the command reuses
    job_env: dict[str, str],  # noqa: F811
    reader: ReaderFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Guarantee 9: `--dry-run --show N` prints the first N intake records and sends
    nothing; the real run then produces exactly those bytes (key, headers, value). The file
    is a spreadsheet's Windows-1252 export (`--encoding`) with local times per zone: no
    column shifts, every row's deliver_at is its own 09:00 in its zone."""
    assert spark is not None
    day = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%d")
    zones = ["Europe/Paris", "America/New_York", "Asia/Tokyo"]
    table = [["id", "message", "local_time", "zone"]] + [
        [f"{i:05d}", f'café, "crème" {i}\nfin', f"{day} 09:00", zones[i % 3]] for i in range(30)
    ]
    path = tmp_path / "export.csv"
    with path.open("w", newline="", encoding="cp1252") as f:
        csv.writer(f, lineterminator="\r\n").writerows(table)
    intake = job_env["BLACKBOX_INTAKE_TOPIC"]
    clients.ensure_topics({"bootstrap.servers": job_env["KAFKA_BOOTSTRAP_SERVERS"]},
                        [intake, job_env["BLACKBOX_EVENTS_TOPIC"]])  # fmt: skip
    args = [str(path), "--caller", "export", "--id", "id", "--topic", "reminders",
            "--due", "local_time", "--zone-column", "zone", "--encoding", "windows-1252",
            "--show", "3"]  # fmt: skip

    assert cli.main(["spark", "schedule", *args, "--dry-run"]) == EXIT_OK
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith('{"topic"')]
    assert len(shown) == 3
    for line, row in zip(shown, table[1:], strict=False):
        record = json.loads(line)
        assert (record["topic"], record["key"]) == (intake, row[0])
        assert record["headers"] == [["CALLER_SERVICE", "export"]]
        at = datetime.fromisoformat(f"{row[2]}:00").replace(tzinfo=ZoneInfo(row[3]))
        due_ms = int(at.timestamp() * 1000)
        assert record["value"] == {"topic": "reminders", "id": row[0], "message": row[1],
                                   "deliver_at": rfc3339(due_ms)}  # fmt: skip
    intake_reader = reader(intake)
    assert intake_reader.read_to_end() == [], "a dry run sends nothing"

    assert cli.main(["spark", "schedule", *args]) == EXIT_OK
    again = [line for line in capsys.readouterr().out.splitlines() if line.startswith('{"topic"')]
    assert again == shown
    produced = {r.key: r for r in intake_reader.wait_count(len(table) - 1)}
    for line in shown:
        record = json.loads(line)
        sent = produced[record["key"].encode()]
        assert sent.value == line.split('"value": ', 1)[1][:-1].encode()  # byte for byte
        assert sent.headers == {"CALLER_SERVICE": b"export"}


# A JSON lines message: objects as a person writes them, and strings.
OBJECTS = ['{"z": 1, "a": [1.50, 2e3], "t": "\\u00e9\\"x\\""}', '{ "nested" : {"n": null} }']
BLOBS = [bytes([i, 0, 255, 10, 13]) + f"é{i}".encode() for i in range(40)]
DOCS = [{"user": f"0{i:03d}", "n": i, "gone": None, "tags": ["a", "é"]} for i in range(40)]
DOC = pa.struct([("user", pa.string()), ("n", pa.int64()), ("gone", pa.string()),
                 ("tags", pa.list_(pa.string()))])  # fmt: skip


def message_text(i: int) -> str:
    """Row i's message as the JSON lines file holds it: an object, or a string."""
    return OBJECTS[i % 2] if i % 3 else json.dumps(PAYLOADS[i % len(PAYLOADS)])


def write_json_lines(path: Path, topic: str, due_ms: int) -> None:
    """40 rows, then a line that is not one JSON object."""
    lines = [f'{{"user_id": "0{i:03d}", "topic": "{topic}", "due_ms": {due_ms + i}, '
             f'"key": {json.dumps(f"0{i}") if i % 2 else "null"}, "payload": {message_text(i)}}}'
             for i in range(40)]  # fmt: skip
    path.write_text("\n".join([*lines, '{"user_id": "9", "payload": {']) + "\n")


def write_parquet(path: Path, topic: str, due_ms: int) -> None:
    """40 rows with a binary message column and a struct one."""
    pq.write_table(pa.table({
        "user_id": [f"0{i:03d}" for i in range(40)], "topic": [topic] * 40,
        "due_ms": pa.array([due_ms + i for i in range(40)], pa.int64()),
        "key": [f"0{i}" if i % 2 else None for i in range(40)], "blob": BLOBS,
        "doc": pa.array(DOCS, DOC),
    }), path)  # fmt: skip


def test_json_lines_and_parquet_are_delivered_as_written(
    spark: SparkSession,  # noqa: F811
    job_env: dict[str, str],  # noqa: F811
    start_service: ServiceFactory,
    reader: ReaderFactory,
    tmp_path: Path,
) -> None:
    """Guarantee 9: JSON lines keep their types and a message object is sent as the JSON
    text the line holds (spacing, key order, `1.50`, escapes); a malformed line is a
    `malformed_row` reject. Parquet bytes are sent byte for byte, a Parquet struct as its
    JSON with every field, a null one included."""
    assert spark is not None
    topic = f"{job_env['BLACKBOX_NAMESPACE']}.typed"
    start_service()
    # What each run's row i is delivered as: a JSON string's text, an object's own JSON text;
    # the bytes; the struct's JSON.
    sent: dict[str, Callable[[int], str | bytes]] = {
        "jsonl": lambda i: json.loads(message_text(i)) if i % 3 == 0 else message_text(i),
        "blob": lambda i: BLOBS[i],
        "doc": lambda i: orjson.dumps(DOCS[i]),
    }
    tables: dict[str, list[dict[str, Any]]] = {}
    for caller, message in (("jsonl", "payload"), ("blob", "blob"), ("doc", "doc")):
        due = int(time.time() * 1000) + AHEAD_MS
        path = tmp_path / (f"{caller}.jsonl" if caller == "jsonl" else f"{caller}.parquet")
        (write_json_lines if caller == "jsonl" else write_parquet)(path, topic, due)
        summary = tmp_path / f"{caller}.json"
        assert cli.main(["spark", "schedule", str(path), "--caller", caller, "--id", "user_id",
                         "--topic-column", "topic", "--message", message, "--key", "key",
                         "--due", "due_ms", "--due-as", "epoch_ms",
                         "--summary", str(summary)]) == EXIT_OK  # fmt: skip
        assert_still_ahead(due)
        counts = json.loads(summary.read_text())
        malformed = {"malformed_row": 1} if caller == "jsonl" else {}
        assert (counts["sent"], counts["rejected"]) == (40, malformed), caller
        tables[caller] = [{"user_id": f"0{i:03d}", "key": f"0{i}" if i % 2 else None,
                           "due_ms": due + i, "value": _bytes(sent[caller](i))}
                          for i in range(40)]  # fmt: skip

    delivered = delivered_all(reader(topic), 120)
    for caller, table in tables.items():
        mine = [r for r in delivered if r.headers["CALLER_SERVICE"] == caller.encode()]
        check_delivered(mine, table, caller, lambda row: row["value"])


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()

"""CSV records split exactly (blackbox.spark.csvrecords): pure, no Spark started."""

from __future__ import annotations

import csv
import io
from typing import Literal

import pandas as pd  # type: ignore[import-untyped]  # no stubs; Spark's extra brings it
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blackbox.spark.csvrecords import MalformedRecord, Records, fields, header, rebuilt

# Any text a cell can hold, line breaks, quotes and commas included.
CELL = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


def written(values: list[str], quoting: Literal[0, 1]) -> str:
    """One record as Python's csv module writes it, its line end taken off."""
    out = io.StringIO()
    csv.writer(out, quoting=quoting, lineterminator="\r\n").writerow(values)
    return out.getvalue().removesuffix("\r\n")


@given(st.lists(CELL, min_size=1, max_size=6), st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
def test_what_pythons_csv_module_writes_is_read_back_exactly(
    values: list[str], quoting: Literal[0, 1]
) -> None:
    """Bulk input is read exactly as the file says (guarantee 9): any cells, written by
    Python's csv module (quotes doubled, fields with commas, CR or LF quoted), come back
    character for character."""
    assert fields(written(values, quoting)) == values


def test_pandas_to_csv_is_read_back_exactly() -> None:
    """Guarantee 9: what pandas' to_csv writes (ids with leading zeros as text, JSON text,
    quotes, commas and line breaks in cells, numbers) splits into exactly its cells."""
    rows = [["000123", '{"a": "x, \\"y\\""}', 40], ["007", 'l1\r\nl2 "q"', 5]]
    for row in rows:
        raw = pd.DataFrame([row]).to_csv(index=False, header=False, lineterminator="\n")
        assert fields(raw.removesuffix("\n")) == [str(v) for v in row]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('a,"b,c",d', ["a", "b,c", "d"]),
        ('"x ""q"" y"', ['x "q" y']),
        ('"l1\r\nl2",z', ["l1\r\nl2", "z"]),
        (" padded , x ", [" padded ", " x "]),
        ("a,,", ["a", "", ""]),
        ('""', [""]),
        ("000123,NULL,#x", ["000123", "NULL", "#x"]),
    ],
)
def test_rfc4180_fields(raw: str, expected: list[str]) -> None:
    """Guarantee 9: quoted fields hold anything, quotes doubled; nothing is trimmed or typed."""
    assert fields(raw) == expected


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('a,"ok "q" x",4', "'q' follows the closing quote of field 2"),
        ('a,"{\\"a\\"}",6', "follows the closing quote of field 2"),  # backslash escapes
        ('a,x"y,c', "a quote inside the unquoted field 2"),
        ('a,"b"  ,c', "' ' follows the closing quote of field 2"),
        ('a,x,"8\r\nb,after', "the quote opening field 3 (character 5 of the record) is never"),
        ("a,b\rc", "a line break inside the unquoted field 2"),
    ],
)
def test_broken_quoting_is_malformed_not_guessed(raw: str, why: str) -> None:
    """A record with broken quoting is rejected with where reading stopped (guarantee 9:
    never silently padded or cut)."""
    with pytest.raises(MalformedRecord, match=why.replace("(", r"\(").replace(")", r"\)")):
        fields(raw)


def test_each_file_is_mapped_by_its_own_header() -> None:
    """Guarantee 9: a second file with its columns in another order is read by name; a
    field count that differs from the header's, or a file whose header names other columns,
    makes each of its rows malformed with its raw text."""
    records = Records(["id", "message"], "why", "raw")
    rows = list(records.rows([
        ("\ufeffid,message", "a.csv"), ("1,one", "a.csv"), ("2,two,extra", "a.csv"),
        ("message,id", "b.csv"), ('"th,ree",3', "b.csv"),
        ("id,other", "c.csv"), ("4,four", "c.csv"),
    ]))  # fmt: skip
    assert rows[0] == {"id": "1", "message": "one", "why": None, "raw": None}
    assert rows[1] == {"id": None, "message": None, "why": "3 fields, the header has 2",
                       "raw": "2,two,extra"}  # fmt: skip
    assert rows[2] == {"id": "3", "message": "th,ree", "why": None, "raw": None}
    assert rows[3]["raw"] == "4,four"
    assert rows[3]["why"] == ("the header line of c.csv names ['id', 'other'], the first "
                              "file's names ['id', 'message']")  # fmt: skip
    assert len(rows) == 4


def test_a_header_naming_a_column_twice_is_refused() -> None:
    """Guarantee 9: a mapping onto a column named twice would be a guess."""
    with pytest.raises(MalformedRecord, match="names the column 'id' twice"):
        header("id,message,id")


def test_a_record_spark_gave_as_tokens_is_rebuilt() -> None:
    """The rare record Spark gives without its raw text still reads as its fields."""
    assert fields(rebuilt(['a "b"', None, "c,d"])) == ['a "b"', "", "c,d"]

"""CSV records read exactly (RFC 4180): a record's raw text -> its fields, or why not. Pure.

Spark's CSV reader finds where each record ends (a quoted field may hold line breaks), but
the values it returns are not always what the file says: it turns a CRLF inside a quoted
field into LF, and it reads a field with broken quoting by guessing where it ends. So the
schedule job asks Spark only for each record's raw text (`inputs.py`) and splits it here:

- a field is either quoted, `"..."` with each `"` inside doubled, holding anything (commas,
  CR, LF), or unquoted, holding no `"`, comma, CR or LF;
- fields are separated by commas, nothing else; no white space is trimmed;
- anything else (a stray quote, text after a closing quote, a quote never closed) makes the
  record malformed, with the character where reading stopped.

Each file starts with its header line; its rows are mapped onto the job's columns by the
names in that header, so files whose columns come in another order are read correctly.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

# Possessive quantifiers: a field of megabytes is one step, never a backtracking search.
_FIELD = re.compile(r'"((?:[^"]++|"")*+)"|([^",\r\n]*+)')
_BOM = "\ufeff"


class MalformedRecord(ValueError):
    """A record that is not RFC 4180 CSV, or does not fit its file's header."""


def fields(raw: str) -> list[str]:
    """The fields of one record's raw text (no line break at its end)."""
    out: list[str] = []
    pos = 0
    while True:
        match = _FIELD.match(raw, pos)
        assert match is not None  # the unquoted branch matches the empty string
        quoted, plain = match.groups()
        out.append(plain if quoted is None else quoted.replace('""', '"'))
        if match.end() == len(raw):
            return out
        if raw[match.end()] != ",":
            raise MalformedRecord(_why(raw, pos, match.end(), len(out)))
        pos = match.end() + 1


def _why(raw: str, start: int, stop: int, number: int) -> str:
    """Why field `number`, starting at `start`, cannot end at `stop`."""
    where = f"field {number} (character {stop + 1} of the record)"
    if raw[start] == '"' and stop == start:
        return f"the quote opening {where} is never closed"
    if raw[start] == '"':
        return (f"{raw[stop]!r} follows the closing quote of {where}: a quote inside a "
                "quoted field is written twice")  # fmt: skip
    if raw[stop] == '"':
        return f"a quote inside the unquoted {where}: quote the field and write the quote twice"
    return f"a line break inside the unquoted {where}"


def header(raw: str) -> list[str]:
    """The column names of a header record: each named once."""
    names = fields(raw.removeprefix(_BOM))
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise MalformedRecord(f"the header names the column {name!r} twice")
        seen.add(name)
    return names


def rebuilt(tokens: Sequence[str | None]) -> str:
    """The raw text of a record Spark gave as tokens only (see `inputs.py`)."""
    out = io.StringIO()
    # The writer quotes a field holding CR or LF only when they are in its line terminator.
    csv.writer(out, lineterminator="\r\n").writerow(["" if t is None else t for t in tokens])
    return out.getvalue().removesuffix("\r\n")


@dataclass
class Records:
    """The records of one Spark partition, in file order, as rows of the job's columns.

    A partition holds whole files (a CSV read with line breaks in quotes is never split), so
    the first record seen from each file is its header.
    """

    columns: Sequence[str]
    malformed: str = "malformed"
    raw: str = "raw"
    _path: str | None = field(default=None, init=False)
    _order: list[str] | None = field(default=None, init=False)
    _header_problem: str | None = field(default=None, init=False)

    def rows(self, records: Iterable[tuple[str, str]]) -> Iterator[dict[str, str | None]]:
        """(raw text, file path) in file order -> one row per data record."""
        for raw, path in records:
            if path != self._path:
                self._start(path, raw)
            else:
                yield self.row(raw)

    def row(self, raw: str) -> dict[str, str | None]:
        """One data record of the current file as a row, or a malformed row holding `raw`."""
        try:
            if self._header_problem is not None:
                raise MalformedRecord(self._header_problem)
            return self._mapped(fields(raw))
        except MalformedRecord as e:
            return {**dict.fromkeys(self.columns), self.malformed: str(e), self.raw: raw}

    def _start(self, path: str, raw: str) -> None:
        self._path, self._order, self._header_problem = path, None, None
        try:
            names = header(raw)
        except MalformedRecord as e:
            self._header_problem = f"the header line of {path} cannot be read: {e}"
            return
        if sorted(names) != sorted(self.columns):
            self._header_problem = (f"the header line of {path} names {names}, the first "
                                    f"file's names {list(self.columns)}")  # fmt: skip
            return
        self._order = names

    def _mapped(self, values: list[str]) -> dict[str, str | None]:
        assert self._order is not None
        if len(values) != len(self._order):
            raise MalformedRecord(f"{len(values)} fields, the header has {len(self._order)}")
        return {**dict(zip(self._order, values, strict=True)), self.malformed: None,
                self.raw: None}  # fmt: skip

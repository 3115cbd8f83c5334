"""The README's table of chart values is the chart's values.yaml, key for key."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from tests.deploy.chart import ROOT, default_values

# Top-level keys whose sub-keys get rows of their own in the table.
EXPANDED = ("metrics",)
ROW = re.compile(r"^\| `([A-Za-z.]+)` \| (.*?) \|")


def _value_keys(values: dict[str, Any]) -> Iterator[str]:
    for key, value in values.items():
        if key in EXPANDED:
            yield from (f"{key}.{sub}" for sub in value)
        else:
            yield key


def _table() -> dict[str, str]:
    """The README's rows under '### Helm' whose first cell is a value: key -> default cell."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Helm\n", 1)[1].split("\n### ", 1)[0]
    return {m[1]: m[2] for line in section.splitlines() if (m := ROW.match(line))}


def test_readme_values_table_lists_every_value() -> None:
    """Each top-level value (and each `metrics.*`) has a row, and no row names a value the
    chart lacks: adding, renaming or removing a value without the README fails here."""
    assert sorted(_table()) == sorted(_value_keys(default_values()))


def test_readme_shows_scalar_defaults_as_they_are() -> None:
    """A row of a plain number or string shows values.yaml's default."""
    table = _table()
    for key, value in default_values().items():
        if isinstance(value, int | str) and not isinstance(value, bool):
            shown = f"`{value}`" if value != "" else '`""`'
            assert table[key] == shown, key

"""The documentation's facts: the table of chart values (the site's Deploying page) is the
chart's values.yaml, key for key; the README is a landing page whose first screen stays true."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

from blackbox.cli.main import _parser
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
    """The Deploying page's rows under '## Helm' whose first cell is a value: key -> its
    default cell."""
    text = (ROOT / "docs" / "deploying.md").read_text()
    section = text.split("\n## Helm\n", 1)[1].split("\n## ", 1)[0]
    return {m[1]: m[2] for line in section.splitlines() if (m := ROW.match(line))}


def test_values_table_lists_every_value() -> None:
    """Each top-level value (and each `metrics.*`) has a row, and no row names a value the
    chart lacks: adding, renaming or removing a value without the docs fails here."""
    assert sorted(_table()) == sorted(_value_keys(default_values()))


def test_values_table_shows_scalar_defaults_as_they_are() -> None:
    """A row of a plain number or string shows values.yaml's default."""
    table = _table()
    for key, value in default_values().items():
        if isinstance(value, int | str) and not isinstance(value, bool):
            shown = f"`{value}`" if value != "" else '`""`'
            assert table[key] == shown, key


README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
SHELL = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_readme_is_a_landing_page() -> None:
    """The README is the landing page (at most ~200 lines); the rest is the site's."""
    assert len(README.read_text().splitlines()) <= 200


def test_readme_links_lead_somewhere() -> None:
    """Every relative link of the README names a file or folder of the repository."""
    targets = [t for t in LINK.findall(README.read_text()) if "://" not in t]
    assert targets
    for target in targets:
        assert (ROOT / target).exists(), target


def test_readme_commands_are_ones_the_tools_take() -> None:
    """The README's first screen stays true: each `make` target it names exists, and each
    `blackbox` command it shows parses as the CLI reads it."""
    blocks = SHELL.findall(README.read_text())
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    targets = {line.split()[1] for line in lines if line.startswith("make ")}
    makefile = (ROOT / "Makefile").read_text()
    assert targets >= {"run", "test"}
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target
    commands = [shlex.split(line)[1:] for line in lines if "bin/blackbox " in line]
    assert commands
    for words in commands:
        _parser().parse_args(words)

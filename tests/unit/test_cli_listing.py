"""How `blackbox list` prints a page: a header naming each column, columns aligned under
it, RFC 3339 times, and a line saying so when a page holds nothing."""

from __future__ import annotations

from blackbox.cli.listing import page_lines, table

ITEM = {"blackbox_id": "@ops/a", "topic": "orders", "due_ms": 1_806_019_200_007,
        "preview": "hello  there"}  # fmt: skip


def test_an_empty_listing_says_nothing_is_pending() -> None:
    """An empty page says so; one cut short by the read budget says it for this page only
    (the `more:` line follows it)."""
    assert page_lines([], series=False) == ["nothing pending"]
    assert page_lines([], series=True, more=True) == ["nothing pending on this page"]


def test_a_schedule_is_listed_under_its_header_with_its_due_time_in_rfc3339() -> None:
    """Each cell starts where its header does; the message's start is printed as it is."""
    header, row = page_lines([ITEM], series=False)
    assert header == "DUE (UTC)                 ID      TOPIC   MESSAGE (START)"
    assert row == "2027-03-26T00:00:00.007Z  @ops/a  orders  hello  there"


def test_the_last_column_is_not_padded() -> None:
    """A long last cell widens nothing; the others take their widest cell."""
    assert table(("A", "B"), [("long", "x" * 30)]) == ["A     B", "long  " + "x" * 30]

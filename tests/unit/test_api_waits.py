"""The API's places for requests waiting on the intake's answer: one caller's load never
takes another caller's place."""

from __future__ import annotations

from contextlib import ExitStack

from blackbox.api.relay import Waits


def _take(waits: Waits, stack: ExitStack, caller: bytes | None, times: int) -> list[bool]:
    return [stack.enter_context(waits.taken(caller)) for _ in range(times)]


def test_one_caller_holds_at_most_its_share_and_others_still_wait() -> None:
    waits = Waits(most=6, per_caller=2)
    with ExitStack() as stack:
        assert _take(waits, stack, b"shop", 3) == [True, True, False]
        assert _take(waits, stack, b"billing", 2) == [True, True]
        assert _take(waits, stack, None, 3) == [True, True, False]
        assert _take(waits, stack, b"ops", 1) == [False], "all six places are held"


def test_places_come_back_when_requests_end() -> None:
    waits = Waits(most=2, per_caller=1)
    with waits.taken(b"shop") as first:
        assert first
        with waits.taken(b"shop") as second:
            assert not second
    with waits.taken(b"shop") as again, waits.taken(b"billing") as other:
        assert (again, other) == (True, True)

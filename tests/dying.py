"""`python -m tests.dying ARGS`: the `blackbox` command whose process dies (SIGKILL, nothing
runs after it) the moment its intake touches a record holding KILLER: a stand-in for a crash
in native code, the death the crash guard exists for. Nothing in blackbox knows of it.

Where it dies is `BLACKBOX_TEST_DIES_IN`: `parsing` (the default: when the record's value is
parsed) or `answering` (when the answer event of a schedule whose id holds KILLER is encoded,
after the record was applied; not the dead letter's answer once it is set aside)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from blackbox import envelope
from blackbox.cli.main import main
from blackbox.kafka import events
from blackbox.kafka.events import Outcome

# A record whose value holds these bytes kills the process that parses it.
KILLER = b"kill-the-intake"
DIES_IN = "BLACKBOX_TEST_DIES_IN"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_in_parsing() -> None:
    parse = envelope.parse

    def dying(value: bytes | None, *args: Any, **kwargs: Any) -> Any:
        if value is not None and KILLER in value:
            _die()
        return parse(value, *args, **kwargs)

    envelope.parse = dying


def _die_in_answering() -> None:
    record = events.Event.record

    def dying(self: events.Event, *args: Any, **kwargs: Any) -> Any:
        own = self.schedule_id
        if own is not None and KILLER.decode() in own and self.outcome is not Outcome.DEAD_LETTERED:
            _die()
        return record(self, *args, **kwargs)

    events.Event.record = dying  # type: ignore[method-assign]


if __name__ == "__main__":
    {"parsing": _die_in_parsing, "answering": _die_in_answering}[
        os.environ.get(DIES_IN, "parsing")
    ]()
    sys.exit(main())

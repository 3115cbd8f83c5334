"""`python -m tests.dying ARGS`: the `blackbox` command whose process dies (SIGKILL, nothing
runs after it) the moment its intake parses a record holding KILLER: a stand-in for a crash
in native code, the death the crash guard exists for. Nothing in blackbox knows of it."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from blackbox import envelope
from blackbox.cli.main import main

# A record whose value holds these bytes kills the process that parses it.
KILLER = b"kill-the-intake"


def _install() -> None:
    parse = envelope.parse

    def dying(value: bytes | None, *args: Any, **kwargs: Any) -> Any:
        if value is not None and KILLER in value:
            os.kill(os.getpid(), signal.SIGKILL)
        return parse(value, *args, **kwargs)

    envelope.parse = dying


if __name__ == "__main__":
    _install()
    sys.exit(main())

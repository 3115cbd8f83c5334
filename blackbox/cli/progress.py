"""A one-line progress bar for long sends, drawn only on a terminal."""

from __future__ import annotations

import time
from types import TracebackType
from typing import TextIO

_WIDTH = 30
_REDRAW_SECONDS = 0.1


class Progress:
    """`done of total` as a bar, redrawn at most ten times a second; silent off a terminal."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty()
        self._drawn_at = 0.0
        self._started = time.monotonic()

    def show(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._drawn_at < _REDRAW_SECONDS and done < self.total):
            return
        self._drawn_at = now
        self.stream.write("\r" + render(done, self.total, now - self._started))
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def render(done: int, total: int, elapsed_seconds: float) -> str:
    """`[#######.....]  700/1000  70%  350/s`."""
    share = done / total if total else 1.0
    filled = round(share * _WIDTH)
    rate = done / elapsed_seconds if elapsed_seconds > 0 else 0.0
    bar = "#" * filled + "." * (_WIDTH - filled)
    return f"[{bar}] {done}/{total} {share:4.0%} {rate:,.0f}/s"

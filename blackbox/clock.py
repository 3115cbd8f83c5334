"""Wall-clock time in the unit every score and header uses: integer epoch milliseconds."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch, by this host's clock."""
    return time.time_ns() // 1_000_000

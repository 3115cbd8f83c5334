"""Backoff: exponential delays with jitter, for retrying a dependency that is away."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from `base` up to `cap`, with full jitter on the upper half."""

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """The delay before the next try, in seconds; each call counts one more failure."""
        ceiling = min(self.cap, self.base * 2.0 ** min(self.failures, 30))
        self.failures += 1
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self.failures = 0

"""Waker: fire at each due instant rather than at the next poll.

It sleeps until the earliest due time that the last claim reported (or one poll interval,
whichever is sooner) and wakes early when nudged: by this replica's intake, or by another
replica's through a Redis pub/sub message carrying the due time. A nudge that comes while
`fire` runs is kept: the claim inside may already have looked, so the next wake-up is no
later than the nudged time.

Wakes are spaced: one begins at least `spacing_ms` after the last one began
(BLACKBOX_FIRE_COALESCE_MS). At a steady 1,000 messages/s nearly every millisecond has a
due instant, and a wake costs about a hundred microseconds whatever it carries; spaced,
the deliveries due within the gap leave together, each at most `spacing_ms` late. A stream
slower than one due instant per gap never waits: its wakes are far apart already.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from blackbox.clock import now_ms

# fire() returns when to run next (epoch ms).
Fire = Callable[[], int]


class Waker:
    """A loop calling `fire` at the instants it returns, woken early by `nudge`."""

    def __init__(self, fire: Fire, stop: threading.Event, spacing_ms: int = 0) -> None:
        self.fire = fire
        self.stop = stop
        self.spacing_ms = spacing_ms
        self.planned_ms = 0
        # Woken through a queue, not an Event: it waits in C, where an Event's wait runs a
        # Condition in Python (the waker sleeps once per due instant: ~1,000 times a second
        # at 1,000 messages/s).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._firing = False
        self._nudged_ms: int | None = None  # the earliest nudge while firing

    def run(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                self._firing, self._nudged_ms = True, None
            began = time.monotonic()  # the spacing: not moved by a step of the wall clock
            wake_at = self.fire()
            with self._lock:
                if self._nudged_ms is not None:
                    wake_at = min(wake_at, self._nudged_ms)
                self._firing, self.planned_ms = False, wake_at
            self._sleep_until(began + self.spacing_ms / 1000)

    def _sleep_until(self, not_before: float) -> None:
        """Sleep until the planned wake-up (epoch ms, moved sooner by nudges meanwhile), no
        sooner than `not_before` (time.monotonic()), or until stopped."""
        while not self.stop.is_set():
            with self._lock:
                planned_ms = self.planned_ms
            delay = max((planned_ms - now_ms()) / 1000, not_before - time.monotonic())
            if delay <= 0:
                break
            try:
                self._wake.get(timeout=delay)  # a nudge: the plan may be sooner now
            except queue.Empty:
                break
        try:
            while True:  # the wakes asked for meanwhile are all served by this one
                self._wake.get_nowait()
        except queue.Empty:
            pass

    def nudge(self, due_ms: int) -> bool:
        """Wake at `due_ms` if that is sooner than planned; True if it was."""
        with self._lock:
            if self._firing:
                if self._nudged_ms is not None and due_ms >= self._nudged_ms:
                    return False
                self._nudged_ms = due_ms
                return True
            if due_ms >= self.planned_ms:
                return False
            self.planned_ms = due_ms
        self._wake.put(None)
        return True

    def nudged_while_firing(self) -> int | None:
        """The earliest due time nudged since the current `fire` began, if it runs."""
        with self._lock:
            return self._nudged_ms if self._firing else None

    def wake(self) -> None:
        """Wake now (shutting down)."""
        self._wake.put(None)

"""Health: whether this replica can do its work, from probes of Redis and the broker.

A thread probes each dependency every few seconds (Redis: its memory, and whether it has
room for intake; Kafka: a metadata request for the intake topic). A dependency is `up`,
`full` (it answers but refuses intake's writes for memory: firing still drains it) or down
with the error. The replica is ready while every dependency is up, its firing clock ticks
and no worker thread has died; it is live while the clock ticks (a tick completed within
`stall_seconds`) and no worker thread has died. A process that does not fire (the intake
role) has no clock: it is live while no worker thread has died. Every change is logged once
(`dependency_up`, `dependency_full`, `dependency_down`) and exported as
`blackbox_up{dependency}` (1 while it answers, full or not) and `blackbox_ready`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import structlog
from prometheus_client import Gauge

from blackbox.errors import RedisFull
from blackbox.metrics import Metrics

log = structlog.get_logger("blackbox.health")

Probe = Callable[[], None]
UP, FULL, DOWN = "up", "full", "down"


class Health:
    """The last answer of each dependency's probe, and whether a worker thread crashed."""

    def __init__(
        self, probes: Mapping[str, Probe], metrics: Metrics, stall_seconds: float | None = 60.0
    ) -> None:
        """`stall_seconds`: how long the firing clock may go without a tick; None: no clock."""
        self.probes = dict(probes)
        self.stall_seconds = stall_seconds
        self._last_beat = time.monotonic()
        self.states = dict.fromkeys(self.probes, DOWN)
        self.errors: dict[str, str] = {}
        self.crashed = False
        # Conditions that keep the replica from being ready although every probe answers
        # (intake partitions stopped for lost data), by name, with what they say.
        self.holds: dict[str, str] = {}
        self._up_gauge = Gauge("blackbox_up", "1 while a dependency answers its probe.",
                               ["dependency"], registry=metrics.registry)  # fmt: skip
        self._ready_gauge = Gauge("blackbox_ready", "1 while this replica is ready to work.",
                                  registry=metrics.registry)  # fmt: skip

    @property
    def ready(self) -> bool:
        return all(state == UP for state in self.states.values()) and self.live and not self.holds

    @property
    def live(self) -> bool:
        return not self.crashed and not self.stalled

    @property
    def stalled(self) -> bool:
        """The firing clock stopped: no tick completed for `stall_seconds`."""
        if self.stall_seconds is None:
            return False
        return time.monotonic() - self._last_beat > self.stall_seconds

    def beat(self) -> None:
        """A firing tick completed."""
        self._last_beat = time.monotonic()

    def report(self) -> dict[str, object]:
        """What /ready answers with."""
        return {
            "ready": self.ready,
            "live": self.live,
            "clock": self._clock(),
            **({"held": dict(self.holds)} if self.holds else {}),
            "dependencies": {
                name: self.errors.get(name, DOWN) if state == DOWN else state
                for name, state in self.states.items()
            },
        }

    def _clock(self) -> str:
        if self.stall_seconds is None:
            return "none"
        return "stalled" if self.stalled else "ticking"

    def probe_all(self) -> None:
        """Run every probe once and record the answers."""
        was_ready = self.ready
        for name, probe in self.probes.items():
            try:
                probe()
            except RedisFull as e:
                self._mark(name, FULL, error=str(e))
            except Exception as e:  # noqa: BLE001 - any failure means "not answering"
                self._mark(name, DOWN, error=f"{type(e).__name__}: {e}")
            else:
                self._mark(name, UP)
        self._ready_gauge.set(1 if self.ready else 0)
        if self.ready != was_ready:
            log.info("ready" if self.ready else "not_ready", **self.report())

    def hold(self, name: str, reason: str | None) -> None:
        """Keep the replica unready for `reason` (None: no longer)."""
        if reason is None:
            self.holds.pop(name, None)
        else:
            self.holds[name] = reason
        self._ready_gauge.set(1 if self.ready else 0)

    def mark_crashed(self) -> None:
        self.crashed = True
        self._ready_gauge.set(0)

    def run(self, stop: threading.Event, interval: float) -> None:
        """Probe every `interval` seconds until `stop` is set."""
        while not stop.is_set():
            self.probe_all()
            stop.wait(interval)

    def _mark(self, name: str, state: str, error: str = "") -> None:
        if self.states[name] != state:
            level = log.info if state == UP else log.warning
            level(f"dependency_{state}", dependency=name, error=error)
        self.states[name] = state
        if error:
            self.errors[name] = error[:300]
        self._up_gauge.labels(dependency=name).set(0 if state == DOWN else 1)

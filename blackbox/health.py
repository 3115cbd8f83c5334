"""Health: whether this replica can do its work, from probes of Redis and the broker.

A thread probes each dependency every few seconds (Redis PING; a metadata request for the
intake topic). The replica is ready while both answer, its firing clock ticks and no worker
thread has died; it is live while the clock ticks (a tick completed within `stall_seconds`)
and no worker thread has died. Every change is logged once and exported as
`blackbox_up{dependency}` and `blackbox_ready`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import structlog
from prometheus_client import Gauge

from blackbox.metrics import Metrics

log = structlog.get_logger("blackbox.health")

Probe = Callable[[], None]


class Health:
    """The last answer of each dependency's probe, and whether a worker thread crashed."""

    def __init__(
        self, probes: Mapping[str, Probe], metrics: Metrics, stall_seconds: float = 60.0
    ) -> None:
        self.probes = dict(probes)
        self.stall_seconds = stall_seconds
        self._last_beat = time.monotonic()
        self.up = dict.fromkeys(self.probes, False)
        self.errors: dict[str, str] = {}
        self.crashed = False
        self._up_gauge = Gauge("blackbox_up", "1 while a dependency answers its probe.",
                               ["dependency"], registry=metrics.registry)  # fmt: skip
        self._ready_gauge = Gauge("blackbox_ready", "1 while this replica is ready to work.",
                                  registry=metrics.registry)  # fmt: skip

    @property
    def ready(self) -> bool:
        return all(self.up.values()) and self.live

    @property
    def live(self) -> bool:
        return not self.crashed and not self.stalled

    @property
    def stalled(self) -> bool:
        """The firing clock stopped: no tick completed for `stall_seconds`."""
        return time.monotonic() - self._last_beat > self.stall_seconds

    def beat(self) -> None:
        """A firing tick completed."""
        self._last_beat = time.monotonic()

    def report(self) -> dict[str, object]:
        """What /ready answers with."""
        return {
            "ready": self.ready,
            "live": self.live,
            "clock": "stalled" if self.stalled else "ticking",
            "dependencies": {
                name: "up" if up else self.errors.get(name, "down") for name, up in self.up.items()
            },
        }

    def probe_all(self) -> None:
        """Run every probe once and record the answers."""
        was_ready = self.ready
        for name, probe in self.probes.items():
            try:
                probe()
            except Exception as e:  # noqa: BLE001 - any failure means "not answering"
                self._mark(name, up=False, error=f"{type(e).__name__}: {e}")
            else:
                self._mark(name, up=True)
        self._ready_gauge.set(1 if self.ready else 0)
        if self.ready != was_ready:
            log.info("ready" if self.ready else "not_ready", **self.report())

    def mark_crashed(self) -> None:
        self.crashed = True
        self._ready_gauge.set(0)

    def run(self, stop: threading.Event, interval: float) -> None:
        """Probe every `interval` seconds until `stop` is set."""
        while not stop.is_set():
            self.probe_all()
            stop.wait(interval)

    def _mark(self, name: str, *, up: bool, error: str = "") -> None:
        if self.up[name] != up:
            level = log.info if up else log.warning
            level("dependency_up" if up else "dependency_down", dependency=name, error=error)
        self.up[name] = up
        if error:
            self.errors[name] = error[:300]
        self._up_gauge.labels(dependency=name).set(1 if up else 0)

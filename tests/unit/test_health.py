"""Readiness and liveness from probe answers, crashed threads and the firing clock."""

from __future__ import annotations

from structlog.testing import capture_logs

from blackbox.errors import RedisFull
from blackbox.health import Health
from blackbox.metrics import Metrics


def _failing() -> None:
    raise ConnectionError("refused")


def _answering() -> None:
    return None


def test_ready_only_once_every_probe_answered() -> None:
    metrics = Metrics()
    health = Health({"redis": _answering, "kafka": _answering}, metrics)
    assert not health.ready  # nothing probed yet

    health.probe_all()

    assert health.ready
    assert metrics.value("blackbox_ready") == 1
    assert metrics.value("blackbox_up", {"dependency": "kafka"}) == 1


def test_a_failing_probe_makes_it_not_ready_but_live_and_says_why() -> None:
    probes = {"redis": _failing, "kafka": _answering}
    metrics = Metrics()
    health = Health(probes, metrics)

    health.probe_all()

    assert (health.ready, health.live) == (False, True)
    report = health.report()
    assert report["dependencies"] == {"redis": "ConnectionError: refused", "kafka": "up"}
    assert metrics.value("blackbox_up", {"dependency": "redis"}) == 0
    probes["redis"] = _answering
    health.probes = probes
    health.probe_all()
    assert health.ready


def test_a_crashed_thread_makes_it_neither_live_nor_ready() -> None:
    health = Health({"redis": _answering}, Metrics())
    health.probe_all()

    health.mark_crashed()

    assert (health.ready, health.live) == (False, False)


def test_a_stopped_firing_clock_makes_it_not_live() -> None:
    """DESIGN: a health signal when the clock stops ticking."""
    ticking = Health({"redis": _answering}, Metrics(), stall_seconds=3600)
    stalled = Health({"redis": _answering}, Metrics(), stall_seconds=-1)
    for health in (ticking, stalled):
        health.probe_all()
        health.beat()

    assert (ticking.live, ticking.ready) == (True, True)
    assert (stalled.live, stalled.ready) == (False, False)
    assert stalled.report()["clock"] == "stalled"


def test_a_full_redis_makes_it_not_ready_says_full_and_logs_each_change_once() -> None:
    """A Redis refusing intake's writes for memory answers, but is not ready for intake:
    /ready says `full`, and the log tells each change once, not at every probe."""
    state = {"full": True}

    def redis_probe() -> None:
        if state["full"]:
            raise RedisFull("command not allowed when used memory > 'maxmemory'")

    metrics = Metrics()
    health = Health({"redis": redis_probe, "kafka": _answering}, metrics)
    with capture_logs() as logs:
        health.probe_all()
        health.probe_all()
        report = health.report()
        state["full"] = False
        health.probe_all()
        health.probe_all()

    assert report["ready"] is False
    assert report["dependencies"] == {"redis": "full", "kafka": "up"}
    assert metrics.value("blackbox_up", {"dependency": "redis"}) == 1  # it answers
    events = [e["event"] for e in logs if e["event"].startswith("dependency_")]
    assert events == ["dependency_full", "dependency_up", "dependency_up"]
    assert [e["dependency"] for e in logs if e["event"] == "dependency_up"] == ["kafka", "redis"]
    assert health.ready

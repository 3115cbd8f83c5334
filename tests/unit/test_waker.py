"""The waker fires at the instants it is given and wakes early only for sooner ones."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from blackbox.clock import now_ms
from blackbox.firing import waker as waker_module
from blackbox.firing.waker import Waker
from tests.kafkatools import wait_until


def test_nudge_only_moves_the_wake_up_earlier() -> None:
    """A nudge for a due time after the planned wake-up changes nothing."""
    waker = Waker(lambda: now_ms() + 60_000, threading.Event())
    waker.planned_ms = 1_000
    assert waker.nudge(2_000) is False
    assert waker.planned_ms == 1_000
    assert waker.nudge(500) is True
    assert waker.planned_ms == 500


def test_a_nudge_wakes_a_sleeping_waker_at_once() -> None:
    """Guarantee 6: a sooner due time ends the waker's sleep (here planned a minute away)."""
    stop = threading.Event()
    fired = threading.Semaphore(0)

    def fire() -> int:
        fired.release()
        return now_ms() + 60_000

    waker = Waker(fire, stop)
    thread = threading.Thread(target=waker.run, daemon=True)
    thread.start()
    assert fired.acquire(timeout=5)
    wait_until(lambda: waker.planned_ms > now_ms(), timeout=5, what="the minute-long plan")
    assert waker.nudge(now_ms())
    assert fired.acquire(timeout=5), "the nudge did not wake the waker"
    stop.set()
    waker.wake()
    thread.join(5)
    assert not thread.is_alive()


def test_a_nudge_while_firing_is_kept_for_the_next_wake_up() -> None:
    """Guarantee 6: a schedule stored while `fire` runs (after its claim looked) still
    fires at its due time, not at the next poll planned a minute away."""
    stop = threading.Event()
    runs: list[int] = []
    nudged = threading.Event()
    again = threading.Semaphore(0)
    waker: Waker

    def fire() -> int:
        runs.append(now_ms())
        if len(runs) == 1:
            assert waker.nudge(now_ms() + 50) is True  # intake, while this run is busy
            assert waker.nudge(now_ms() + 100) is False  # later than the kept one
            nudged.set()
        else:
            again.release()
        return now_ms() + 60_000

    waker = Waker(fire, stop)
    thread = threading.Thread(target=waker.run, daemon=True)
    thread.start()
    assert nudged.wait(5)
    assert again.acquire(timeout=5), "the nudge during the run was dropped"
    assert runs[1] - runs[0] < 30_000
    stop.set()
    waker.wake()
    thread.join(5)
    assert not thread.is_alive()


def test_a_nudge_while_firing_is_told_to_the_running_fire() -> None:
    """The dispatcher, waiting for reports inside `fire`, can see a sooner due time."""
    seen: list[int | None] = []
    waker: Waker

    def fire() -> int:
        seen.append(waker.nudged_while_firing())
        waker.nudge(1_234)
        seen.append(waker.nudged_while_firing())
        stop.set()
        return now_ms()

    stop = threading.Event()
    waker = Waker(fire, stop)
    waker.run()

    assert seen == [None, 1_234]
    assert waker.nudged_while_firing() is None  # not firing any more


def _run(waker: Waker) -> threading.Thread:
    thread = threading.Thread(target=waker.run, daemon=True)
    thread.start()
    return thread


def _stopped(waker: Waker, thread: threading.Thread) -> None:
    waker.stop.set()
    waker.wake()
    thread.join(5)
    assert not thread.is_alive()


def test_wakes_are_spaced_by_the_coalescing_interval() -> None:
    """BLACKBOX_FIRE_COALESCE_MS: asked to wake at once, again and again (a due instant
    every millisecond, and nudges for each), the waker begins a run no sooner than the
    interval after the last one began; so the deliveries due meanwhile leave together."""
    runs: list[int] = []
    waker: Waker

    def fire() -> int:
        runs.append(now_ms())
        waker.nudge(now_ms())  # sooner than anything: a short countdown
        return now_ms()  # something is due at once

    waker = Waker(fire, threading.Event(), spacing_ms=40)
    thread = _run(waker)
    wait_until(lambda: len(runs) >= 6, timeout=10, what="six runs")
    _stopped(waker, thread)
    gaps = [later - earlier for earlier, later in itertools.pairwise(runs)]
    assert min(gaps) >= 40, gaps


def test_a_nudge_after_a_quiet_spell_wakes_at_once_whatever_the_spacing() -> None:
    """Spacing counts from the last run: the first due instant after a quiet spell (here
    past the interval already) waits for nothing."""
    fired = threading.Semaphore(0)

    def fire() -> int:
        fired.release()
        return now_ms() + 60_000

    waker = Waker(fire, threading.Event(), spacing_ms=200)
    thread = _run(waker)
    assert fired.acquire(timeout=5)
    quiet_from = time.monotonic()  # a quiet spell longer than the spacing
    wait_until(lambda: time.monotonic() - quiet_from > 0.25, timeout=5, what="a quiet spell")
    nudged_at = time.monotonic()
    assert waker.nudge(now_ms())
    assert fired.acquire(timeout=5)
    woke_after = time.monotonic() - nudged_at
    _stopped(waker, thread)
    assert woke_after < 0.15, f"the nudge waited {woke_after:.3f} s for the spacing"


def test_a_nudge_within_the_spacing_waits_for_its_end_not_for_the_plan() -> None:
    """A nudge soon after a run is served when the interval ends, not at the plan made
    a minute away, and not before the interval ends."""
    runs: list[float] = []
    fired = threading.Semaphore(0)

    def fire() -> int:
        runs.append(time.monotonic())
        fired.release()
        return now_ms() + 60_000

    waker = Waker(fire, threading.Event(), spacing_ms=300)
    thread = _run(waker)
    assert fired.acquire(timeout=5)
    wait_until(lambda: waker.planned_ms > now_ms() + 30_000, timeout=5, what="the plan")
    assert waker.nudge(now_ms())
    assert fired.acquire(timeout=5), "the nudge was not served"
    _stopped(waker, thread)
    assert 0.29 <= runs[1] - runs[0] < 5, runs


def test_a_backward_step_of_the_wall_clock_does_not_hold_nudges_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The spacing is kept on the monotonic clock: the wall clock stepping back 3 s while
    a wake runs (an NTP correction) must not hold a due message back by 3 s."""
    step_ms = [0]

    def stepped() -> int:
        return now_ms() - step_ms[0]

    monkeypatch.setattr(waker_module, "now_ms", stepped)
    fired = threading.Semaphore(0)

    def fire() -> int:
        step_ms[0] = 3_000  # the clock steps back during the first wake
        fired.release()
        return stepped() + 60_000

    waker = Waker(fire, threading.Event(), spacing_ms=3)
    thread = _run(waker)
    assert fired.acquire(timeout=5)
    wait_until(lambda: waker.planned_ms > stepped(), timeout=5, what="the plan")
    nudged_at = time.monotonic()
    assert waker.nudge(stepped())  # due now, by the stepped clock
    served = fired.acquire(timeout=10)
    waited = time.monotonic() - nudged_at
    _stopped(waker, thread)
    assert served
    assert waited < 1, f"the nudge was served after {waited:.3f} s"

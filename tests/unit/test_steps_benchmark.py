"""benchmarks.steps: its timers, its readings, and the steps it names still being there."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import pytest

from benchmarks import steps


class Worker:
    def spin(self, seconds: float) -> str:
        ends = time.thread_time() + seconds
        while time.thread_time() < ends:
            pass
        return "spun"

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def fail(self) -> None:
        raise ValueError("failed")


def test_every_step_names_a_method_of_the_service() -> None:
    """A method renamed or moved fails here, not as a step silently missing from a run."""
    for module, owner, name in steps.STEPS.values():
        cls = getattr(importlib.import_module(module), owner)
        assert callable(getattr(cls, name)), (module, owner, name)


def test_a_timed_method_counts_its_calls_and_its_cpu_not_its_sleeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    totals: steps.Totals = {}
    for name in ("spin", "sleep", "fail"):
        monkeypatch.setattr(Worker, name, steps.timed(totals, name, getattr(Worker, name)))
    worker = Worker()
    assert worker.spin(0.02) == "spun"
    worker.spin(0.02)
    worker.sleep(0.05)
    with pytest.raises(ValueError, match="failed"):
        worker.fail()
    assert totals["spin"][1] == 2
    assert totals["spin"][0] >= 0.04
    assert totals["sleep"][1] == 1
    assert totals["sleep"][0] < 0.02  # asleep, not spending
    assert totals["fail"][1] == 1  # a call that raised still counts


def test_install_wraps_each_named_method_in_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Worker, "spin", Worker.spin)  # undone after the test
    totals: steps.Totals = {}
    steps.install(totals, {"spinning": (__name__, "Worker", "spin")})
    Worker().spin(0.001)
    assert totals["spinning"][1] == 1


def test_the_totals_read_back_as_written_and_grow_per_message(tmp_path: Path) -> None:
    path = tmp_path / "steps.json"
    assert steps.read(path) == {}  # before the timed process's first write
    steps.write({"a": [0.5, 10], "b": [0.0, 0]}, path)
    before = steps.read(path)
    steps.write({"a": [1.5, 30], "b": [0.25, 5], "new": [0.1, 1]}, path)
    grown = steps.per_message(before, steps.read(path), count=1000)
    assert grown == {
        "a": {"us": 1000.0, "calls": 0.02},
        "b": {"us": 250.0, "calls": 0.005},
        "new": {"us": 100.0, "calls": 0.001},
    }
    assert not path.with_suffix(".partial").exists()

"""Where a steady message's CPU goes, step by step: the service's own CPU in each step of
intake and firing, per message, at a steady rate.

    python -m benchmarks.steps                          # 1,000/s for 20 s, the defaults
    python -m benchmarks.steps --rates 100 1000 10000
    BLACKBOX_SHARDS=1 python -m benchmarks.steps        # the same on one shard

Runs `benchmarks.steady`'s scenario with its subject `steps`: `blackbox run` of this
checkout with a timer around each step below (`time.thread_time`: the CPU of the thread
running it, its callees included, its sleeps left out). The timed process writes its
totals to a file as it goes; the figures are the totals' growth from the first record sent
to the last delivered, per message, with the number of calls per message: a step called
once a window costs per message what it costs per call over the messages of a window.
Steps nest (a wake's release is also in the wake), so they do not add up to the whole;
the whole is the run's `subject_cpu_us_per_message`, the timers' own cost (about a
microsecond a call) included.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

# Step name -> (module, class, method).
STEPS: dict[str, tuple[str, str, str]] = {
    "intake: a poll's records gathered": ("blackbox.intake.loop", "Intake", "_consume"),
    "intake: a poll's records handled": ("blackbox.intake.loop", "Intake", "handle"),
    "intake: crash note (a Redis write)": ("blackbox.intake.crashguard", "CrashGuard", "note"),
    "intake: a record parsed": ("blackbox.intake.sorting", "Sorting", "sort"),
    "intake: script calls sent": ("blackbox.storage.applying", "Applying", "send"),
    "intake: script replies read": ("blackbox.storage.applying", "Applying", "codes"),
    "intake: answered": ("blackbox.intake.loop", "Intake", "_answer"),
    "firing: a wake, all of it": ("blackbox.firing.runner", "Firing", "fire"),
    "firing: a wake": ("blackbox.firing.dispatcher", "Dispatcher", "fire_due"),
    "firing: reports awaited": ("blackbox.firing.dispatcher", "Dispatcher", "_await_reports"),
    "firing: settled when ready": ("blackbox.firing.dispatcher", "Dispatcher", "_settle_ready"),
    "firing: shares looked at": ("blackbox.firing.shares", "Share", "due_by"),
    "firing: next due looked up": ("blackbox.firing.shares", "Share", "next_due_ms"),
    "firing: a delivery reported": ("blackbox.kafka.outbox", "Reports", "report"),
    "firing: due deliveries produced": ("blackbox.firing.flight", "Flight", "release_due"),
    "kafka: a record handed to a producer": ("blackbox.kafka.outbox", "Outbox", "produce"),
    "firing: claims (a round trip)": ("blackbox.storage.store", "RedisStore", "claim_all"),
    "firing: a claim prepared": ("blackbox.firing.batch", "Preparing", "prepare"),
    "firing: batches settled": ("blackbox.firing.settling", "Settler", "settle"),
    "firing: acks (a round trip)": ("blackbox.storage.store", "RedisStore", "ack_all"),
    "firing: asleep between wakes": ("blackbox.firing.waker", "Waker", "_sleep_until"),
}
DUMP_EVERY_S = 0.25

Totals = dict[str, list[float]]  # step -> [thread CPU seconds, calls]


def timed(totals: Totals, step: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, adding each call's thread CPU and the call to `totals[step]`."""
    spent = totals.setdefault(step, [0.0, 0])
    clock = time.thread_time

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return method(*args, **kwargs)
        finally:
            spent[0] += clock() - started
            spent[1] += 1

    return wrapper


def install(totals: Totals, steps: dict[str, tuple[str, str, str]] = STEPS) -> None:
    """Wrap each step's method in its class (before the service builds its objects)."""
    for step, (module, owner, name) in steps.items():
        cls = getattr(importlib.import_module(module), owner)
        setattr(cls, name, timed(totals, step, getattr(cls, name)))


def write(totals: Totals, path: Path) -> None:
    """The totals so far, replacing the file whole (a reader never sees half of it)."""
    scratch = path.with_suffix(".partial")
    scratch.write_bytes(orjson.dumps({step: list(v) for step, v in totals.items()}))
    scratch.replace(path)


def read(path: Path) -> Totals:
    """The totals the timed process wrote last (none before its first write)."""
    try:
        found: Totals = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    return found


def per_message(before: Totals, after: Totals, count: int) -> dict[str, dict[str, float]]:
    """Each step's growth between two readings: µs of CPU and calls, per message."""
    grown = {}
    for step, (spent, calls) in after.items():
        was = before.get(step, [0.0, 0])
        grown[step] = {"us": round((spent - was[0]) / count * 1e6, 1),
                       "calls": round((calls - was[1]) / count, 3)}  # fmt: skip
    return grown


def serve(path: Path) -> int:
    """Run `blackbox run` with the steps timed, writing the totals every DUMP_EVERY_S."""
    totals: Totals = {}
    install(totals)

    def dump() -> None:
        while True:
            time.sleep(DUMP_EVERY_S)
            write(totals, path)

    threading.Thread(target=dump, name="steps", daemon=True).start()
    from blackbox.cli.main import main  # noqa: PLC0415 - after the steps are wrapped

    return main(["run"])


def table(result: dict[str, Any]) -> str:
    steps = result["steps_per_message"]
    lines = [f"  {result['rate_per_s']:>6}/s, service {result['subject_cpu_us_per_message']} µs "
             f"a message; by step, µs and calls a message:"]  # fmt: skip
    for step, figures in steps.items():
        lines.append(f"    {step:<38} {figures['us']:>7.1f} µs {figures['calls']:>8.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=int, nargs="+", default=[1000])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        return serve(args.serve)
    from benchmarks import steady  # noqa: PLC0415 - the timed process does not need it

    for rate in args.rates:
        result = steady.one_run("steps", rate, args.seconds, None)
        print(orjson.dumps(result).decode(), flush=True)  # noqa: T201 - figures
        print(table(result), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""Compare two versions of the service side by side: runs of one scenario, alternated.

    git worktree add /tmp/base <commit>
    python -m benchmarks.ab --base /tmp/base s3 --runs 3
    python -m benchmarks.ab --base /tmp/base s1 --runs 3 --fields last_after_due_ms
    python -m benchmarks.ab --base . --base-env BLACKBOX_SHARDS=1 s2 --runs 5

Each run is `python -m benchmarks.scenarios NAME` in a fresh process started in the
checkout it measures (`python -m` puts the working directory first on the path, for the
service it spawns too), A (the `--base` checkout) then B (this one), repeated: the
machine's drift falls on both alike. Prints each run's figures and, per field, A's and
B's medians. `--base-env NAME=VALUE` sets a variable for A's runs only: with `--base .`,
one checkout under two settings (one shard against the default). A field inside a nested
object is named with a dot: `own_lateness_ms.p99`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any

import orjson

DEFAULT_FIELDS = {
    "s1": [
        "last_after_due_ms",
        "fire_rate_per_s",
        "service_cpu_us_per_fired",
        "redis_cpu_us_per_fired",
        "floor.cpu_us_per_message",
        "service_cpu_over_floor",
    ],
    "s2": [
        "own_lateness_ms.p50",
        "own_lateness_ms.p99",
        "lateness_ms.p50",
        "lateness_ms.p99",
        "broker_probe_ms.p99",
        "service_cpu_us_per_message",
        "redis_cpu_us_per_message",
    ],
    "s3": [
        "records_per_s",
        "service_cpu_us_per_record",
        "redis_cpu_us_per_record",
        "floor.cpu_us_per_record",
    ],
}


def run(scenario: str, base: str | None, extra: dict[str, str]) -> dict[str, Any]:
    """One run of `scenario` in the checkout `base` (None: this one), `extra` added to its
    environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | extra
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.scenarios", scenario],
        cwd=base or os.getcwd(), env=env, capture_output=True, check=True, text=True,
    )  # fmt: skip
    first = next(line for line in done.stdout.splitlines() if line.startswith("{"))
    result: dict[str, Any] = orjson.loads(first)
    return result


def field(result: dict[str, Any], name: str) -> float:
    """A figure of `result`, `outer.inner` inside a nested object; NaN if absent."""
    value: Any = result
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else float("nan")


def assignments(written: list[str]) -> dict[str, str]:
    """`NAME=VALUE` arguments as a mapping."""
    pairs = [item.partition("=") for item in written]
    if any(not name or not sep for name, sep, _ in pairs):
        raise SystemExit(f"--base-env takes NAME=VALUE, got {written}")
    return {name: value for name, _, value in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenario", choices=sorted(DEFAULT_FIELDS))
    parser.add_argument("--base", required=True, help="checkout of version A")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fields", nargs="*", help="JSON fields to compare")
    parser.add_argument(
        "--base-env", action="append", default=[], help="NAME=VALUE for A's runs (repeatable)"
    )
    args = parser.parse_args()
    fields = args.fields or DEFAULT_FIELDS[args.scenario]
    envs = {"A": assignments(args.base_env), "B": {}}
    results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for n in range(args.runs):
        for label, base in (("A", args.base), ("B", None)):
            result = run(args.scenario, base, envs[label])
            results[label].append(result)
            shown = {f: field(result, f) for f in fields}
            print(f"run {n + 1} {label}: {orjson.dumps(shown).decode()}", flush=True)  # noqa: T201
    for name in fields:
        a = statistics.median(field(r, name) for r in results["A"])
        b = statistics.median(field(r, name) for r in results["B"])
        ratio = f"{b / a:.2f}" if a else "-"  # a median of 0 ms (own lateness on one shard)
        print(f"{name}: A median {a:g}  B median {b:g}  B/A {ratio}", flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())

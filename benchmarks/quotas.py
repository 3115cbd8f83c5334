"""Intake with a per-caller quota (`max_pending`) against none: records/s and service CPU
per record.

    python -m benchmarks.quotas [--count N] [--rounds R]

Each round runs both on a fresh stack, alternating which goes first (the machine drifts):
COUNT records of one caller, due in an hour, are produced to the intake topic first, then
`blackbox run` starts and stores them. With the quota (large enough never to refuse), each
record's id also goes to its caller's owned set, and each part of a poll reads the count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import orjson
import redis

from benchmarks.signing import produce_records
from benchmarks.stack import local_stack, service_process, time_storing


def _policy(work: Path, count: int) -> str:
    path = work / "policy.yaml"
    path.write_text(
        f'default:\n  topics: ["*"]\ncallers:\n  billing:\n    max_pending: {count * 2}\n'
    )
    return str(path)


def run(count: int, quota: bool) -> dict[str, float]:
    with local_stack() as stack:
        if quota:
            stack.env["BLACKBOX_POLICY_FILE"] = _policy(stack.work, count)
        produce_records(stack.settings.kafka["bootstrap.servers"], stack.settings.intake_topic,
                        count, signed=False)  # fmt: skip
        client = redis.Redis.from_url(stack.redis.url)
        with service_process(stack) as process:
            storing = time_storing(client, stack.layout, count, process.pid)
        client.close()
        elapsed, cpu = storing.seconds, storing.service_cpu
    return {
        "records_per_s": round(count / elapsed),
        "cpu_us_per_record": round(cpu / count * 1e6, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for round_ in range(args.rounds):
        for quota in (round_ % 2 == 0, round_ % 2 == 1):
            result = run(args.count, quota)
            results[quota].append(result)
            print(orjson.dumps({"quota": quota, **result}).decode(), flush=True)  # noqa: T201
    for quota, runs in results.items():
        rate = statistics.median(r["records_per_s"] for r in runs)
        cpu = statistics.median(r["cpu_us_per_record"] for r in runs)
        label = "quota   " if quota else "no quota"
        print(f"{label} median of {len(runs)}: {rate:,.0f} records/s, {cpu} µs CPU/record")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())

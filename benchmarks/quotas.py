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
import sys
from pathlib import Path

from benchmarks.signing import alternated, intake_run


def _policy(work: Path, count: int) -> str:
    path = work / "policy.yaml"
    path.write_text(
        f'default:\n  topics: ["*"]\ncallers:\n  billing:\n    max_pending: {count * 2}\n'
    )
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    def run(quota: bool) -> dict[str, float]:
        policy = (lambda work: _policy(work, args.count)) if quota else None
        return intake_run(args.count, False, policy)

    return alternated(run, args.rounds, "quota", ("quota   ", "no quota"))


if __name__ == "__main__":
    sys.exit(main())

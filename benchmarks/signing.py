"""Intake with signed envelopes against unsigned ones: records/s and service CPU per record.

    python -m benchmarks.signing [--count N] [--rounds R]

Each round runs both on a fresh stack, alternating which goes first (the machine drifts):
COUNT records due in an hour are produced to the intake topic first, then `blackbox run`
starts and stores them; the signed runs use a policy that requires billing's signature,
and every record carries one (made before the clock starts, as a producer would).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import redis
from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from benchmarks.producing import produce_waiting
from benchmarks.stack import local_stack, service_process, time_storing
from blackbox.envelope import CALLER_HEADER, Header
from blackbox.signing import Parts, Signer, public_text

KEY = Ed25519PrivateKey.generate()


def _policy(work: Path) -> str:
    path = work / "policy.yaml"
    path.write_text("callers:\n  billing:\n    require_signature: true\n"
                    f"    keys: {{bench-1: \"{public_text(KEY.public_key())}\"}}\n")  # fmt: skip
    return str(path)


def produce_records(bootstrap: str, intake: str, count: int, signed: bool) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    signer, target = Signer(KEY, "bench-1"), f"sig-{uuid.uuid4().hex[:8]}"
    now = time.time_ns() // 1_000_000
    for n in range(count):
        value = orjson.dumps({"topic": target, "message": n, "countdown": 3600})
        headers: list[Header] = [(CALLER_HEADER, b"billing")]
        if signed:
            headers.append(signer.header(Parts(intake, None, value, headers), issued_ms=now))
        produce_waiting(producer, intake, value, headers=[*headers])
    producer.flush(60)


def intake_run(
    count: int, signed: bool, policy_file: Callable[[Path], str] | None
) -> dict[str, float]:
    """One run on a fresh stack: COUNT records (signed or not) produced first, then stored
    by `blackbox run` under the policy `policy_file` writes (None: none); records/s and
    service CPU per record."""
    with local_stack() as stack:
        if policy_file is not None:
            stack.env["BLACKBOX_POLICY_FILE"] = policy_file(stack.work)
        produce_records(stack.settings.kafka["bootstrap.servers"], stack.settings.intake_topic,
                        count, signed)  # fmt: skip
        client = redis.Redis.from_url(stack.redis.url)
        with service_process(stack) as process:
            storing = time_storing(client, stack.layout, count, process.pid)
        client.close()
        elapsed, cpu = storing.seconds, storing.service_cpu
    return {
        "records_per_s": round(count / elapsed),
        "cpu_us_per_record": round(cpu / count * 1e6, 1),
    }


def alternated(
    run: Callable[[bool], dict[str, float]], rounds: int, name: str, labels: tuple[str, str]
) -> int:
    """`run(True)` and `run(False)` in each of `rounds`, which goes first alternating; each
    run's figures as a JSON line, then the medians of each (`labels`: with, without)."""
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for round_ in range(rounds):
        for with_it in (round_ % 2 == 0, round_ % 2 == 1):
            result = run(with_it)
            results[with_it].append(result)
            print(orjson.dumps({name: with_it, **result}).decode(), flush=True)  # noqa: T201
    for with_it, runs in results.items():
        rate = statistics.median(r["records_per_s"] for r in runs)
        cpu = statistics.median(r["cpu_us_per_record"] for r in runs)
        label = labels[0] if with_it else labels[1]
        print(f"{label} median of {len(runs)}: {rate:,.0f} records/s, {cpu} µs CPU/record")  # noqa: T201
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    def run(signed: bool) -> dict[str, float]:
        return intake_run(args.count, signed, _policy if signed else None)

    return alternated(run, args.rounds, "signed", ("signed  ", "unsigned"))


if __name__ == "__main__":
    sys.exit(main())

"""What the scale-out benchmarks read from the parts they run: CPU time per part over a
span, Redis's slow calls, and the spread of figures over repeated runs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.stack import ServiceProcess, cpu_seconds, redis_cpu_seconds
from blackbox.dev.servers import KafkaBroker
from blackbox.storage.connections import RedisClient, primaries

Result = dict[str, object]


def redis_cpu(client: RedisClient) -> float:
    """CPU seconds every Redis master has used so far, summed."""
    return sum(redis_cpu_seconds(node) for node in primaries(client))


@dataclass(frozen=True)
class Spent:
    """CPU seconds each part used over a span of wall-clock `seconds`."""

    seconds: float
    processes: list[float]
    redis: float
    broker: float

    def per(self, count: int, unit: str) -> Result:
        """The span's figures, CPU as µs per `unit` (the span did `count` of them)."""
        total = sum(self.processes) + self.redis + self.broker
        return {
            "seconds": round(self.seconds, 3),
            f"service_cpu_us_per_{unit}": round(sum(self.processes) / count * 1e6, 1),
            f"redis_cpu_us_per_{unit}": round(self.redis / count * 1e6, 1),
            f"broker_cpu_us_per_{unit}": round(self.broker / count * 1e6, 1),
            "cores_busy": round(total / self.seconds, 2),
            "process_cores_busy": [round(p / self.seconds, 2) for p in self.processes],
        }


class Cpu:
    """CPU time of the service processes, the Redis masters and the broker from now on."""

    def __init__(
        self, client: RedisClient, broker: KafkaBroker, processes: Sequence[ServiceProcess]
    ) -> None:
        self.client = client
        self.broker_pid = broker.process.pid if broker.process else 0
        self.pids = [p.pid for p in processes]
        self.began = time.monotonic()
        self.processes = [cpu_seconds(pid) for pid in self.pids]
        self.redis = redis_cpu(client)
        self.broker = cpu_seconds(self.broker_pid)

    def stop(self) -> Spent:
        seconds = time.monotonic() - self.began
        return Spent(
            seconds,
            [
                cpu_seconds(pid) - before
                for pid, before in zip(self.pids, self.processes, strict=True)
            ],
            redis_cpu(self.client) - self.redis,
            cpu_seconds(self.broker_pid) - self.broker,
        )


class Slowlog:
    """Redis's slow log on every master, emptied when made: the calls that took longer
    than `over_us` µs inside Redis (a script counts as one call)."""

    def __init__(self, client: RedisClient, over_us: int) -> None:
        self.nodes = primaries(client)
        for node in self.nodes:
            node.config_set("slowlog-log-slower-than", over_us)
            node.config_set("slowlog-max-len", 100_000)
            node.slowlog_reset()

    def read(self, limit_us: int) -> Result:
        """The slowest call, how many took over `limit_us`, and the three slowest commands."""
        entries = [e for node in self.nodes for e in node.slowlog_get(100_000)]
        entries.sort(key=lambda e: -int(e["duration"]))
        return {
            "slowest_redis_call_ms": round(int(entries[0]["duration"]) / 1000, 1)
            if entries else 0.0,
            f"redis_calls_over_{limit_us // 1000}ms": sum(
                int(e["duration"]) > limit_us for e in entries
            ),
            "slowest_redis_commands": [
                [_command(e["command"]), round(int(e["duration"]) / 1000, 1)] for e in entries[:3]
            ],
        }  # fmt: skip


def _command(command: bytes | str) -> str:
    text = command.decode(errors="replace") if isinstance(command, bytes) else command
    return text.split(" ", 1)[0]


def spread(results: Sequence[Result], key: Sequence[str]) -> str:
    """A table of every numeric figure per setting: "low-high" over the runs of that setting."""
    groups: dict[tuple[object, ...], list[Result]] = {}
    for result in results:
        groups.setdefault(tuple(result[k] for k in key), []).append(result)
    lines = []
    for setting, runs in groups.items():
        lines.append(
            " ".join(f"{k}={v}" for k, v in zip(key, setting, strict=True)) + f" ({len(runs)} runs)"
        )
        for name, value in runs[0].items():
            if name in key or not isinstance(value, int | float):
                continue
            values = [r[name] for r in runs if isinstance(r.get(name), int | float)]
            low, high = min(values), max(values)  # type: ignore[type-var]
            shown = f"{low}" if low == high else f"{low}-{high}"
            lines.append(f"  {name:<36}{shown}")
    return "\n".join(lines)

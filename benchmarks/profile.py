"""Profile the service process while a scenario runs: py-spy samples and Redis's commandstats.

    python -m benchmarks.profile s3             # intake
    python -m benchmarks.profile s1 --native    # burst firing, C frames too

Runs the scenario (benchmarks.scenarios) in this process; a watcher waits for the
`blackbox run` it spawns, and once that answers /ready, starts `py-spy record --format raw`
on its pid and reads Redis's `INFO commandstats` until it exits. Prints the scenario's
figures, the top frames by share of the samples (self: the frame was running; total: the
frame was on the stack) and the Redis commands per message.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import redis

from benchmarks.scenarios import SCENARIOS, table
from benchmarks.stack import cpu_seconds, redis_cpu_seconds
from blackbox.dev.servers import scratch_dir
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import pending_counts

REPO = Path(__file__).resolve().parent.parent
PREFIXES = sorted(
    {
        (sysconfig.get_paths()["purelib"], "site-packages"),
        (sysconfig.get_paths()["platlib"], "site-packages"),
        (sysconfig.get_paths()["stdlib"], "stdlib"),
        (str(REPO), ""),
    },
    key=lambda p: -len(p[0]),
)
LINE = re.compile(r":\d+\)$")
ADDRESS = re.compile(r"0x[0-9a-f]+ ")  # an unnamed native frame
OUTER = ("<module>", "_run_code", "_run_module_as_main", "Thread.run", "Thread._bootstrap",
         "thread_run ")  # fmt: skip


def _short(frame: str) -> str:
    """A frame with its file named from the repository, site-packages or the stdlib."""
    for prefix, name in PREFIXES:
        if prefix in frame:
            return frame.replace(prefix + "/", f"{name}/" if name else "")
    return frame


def _service_pid(parent: int) -> int | None:
    """A `python -m blackbox run` process whose parent is `parent`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == parent and argv[1:4] == [b"-m", b"blackbox", b"run"]:
            return int(entry.name)
    return None


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _ready(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[0] != "Z"


@dataclass
class Watcher:
    """Waits for the service, records it with py-spy and samples Redis's commandstats."""

    out: Path
    rate: int
    native: bool
    gil: bool
    pid: int | None = None
    before: dict[str, dict[str, float]] = field(default_factory=dict)
    after: dict[str, dict[str, float]] = field(default_factory=dict)
    spy: subprocess.Popen[bytes] | None = None
    # (service CPU s, Redis CPU s, messages in the due set, commandstats) every 0.2 s
    timeline: list[tuple[float, float, int, dict[str, dict[str, float]]]] = field(
        default_factory=list
    )
    error: str | None = None

    def run(self) -> None:
        while (pid := _service_pid(os.getpid())) is None:
            time.sleep(0.01)
        self.pid = pid
        env = _environ(pid)
        while not _ready(env["BLACKBOX_HTTP_PORT"]):
            if not _alive(pid):
                self.error = "the service exited before it was ready"
                return
            time.sleep(0.02)
        client = redis.Redis.from_url(env["REDIS_URL"])
        self.before = client.info("commandstats")
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
        args = [spy, "record", "--pid", str(pid), "--rate", str(self.rate), "--format", "raw",
                "--output", str(self.out)]  # fmt: skip
        # Native stacks need the process paused while sampled; Python's alone do not.
        args.append("--native" if self.native else "--nonblocking")
        if self.gil:
            args.append("--gil")
        self.spy = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Redis stops right after the service: keep the last reading taken while it ran.
        settings = Settings.from_env(env)
        layout = Layout(settings.namespace, settings.shards or DEFAULT_SHARDS)
        while _alive(pid):
            try:
                self.after = client.info("commandstats")
                due = pending_counts(client, layout)[0]
                reading = (cpu_seconds(pid), redis_cpu_seconds(client), due)
            except (redis.RedisError, OSError, IndexError):
                break
            self.timeline.append((*reading, self.after))
            time.sleep(0.2)

    def phases(self) -> list[tuple[str, int, float, float, dict[str, dict[str, float]]]]:
        """Storing (until the due set is fullest) and firing (from then on): messages, the
        service's and Redis's CPU seconds, and commandstats at the phase's start."""
        if not self.timeline:
            return []
        peak = max(range(len(self.timeline)), key=lambda i: self.timeline[i][2])
        first, top, last = self.timeline[0], self.timeline[peak], self.timeline[-1]
        return [
            ("storing", top[2] - first[2], top[0] - first[0], top[1] - first[1], first[3]),
            ("firing", top[2] - last[2], last[0] - top[0], last[1] - top[1], top[3]),
        ]


def top_frames(raw: Path, count: int) -> tuple[int, list[tuple[str, int, int]]]:
    """All samples, and the `count` frames with the most: (frame, self, total)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = [_short(f) for f in stack.split(";")]
        samples += int(n)
        own[frames[-1]] += int(n)
        for frame in set(frames):
            total[frame] += int(n)
    ranked = sorted(own, key=lambda f: -own[f])[:count]
    return samples, [(f, own[f], total[f]) for f in ranked]


def inclusive(raw: Path, count: int) -> list[tuple[str, int]]:
    """The `count` functions on the stack in the most samples, whatever their line (threads'
    and modules' own frames left out)."""
    total: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        for frame in {LINE.sub(")", _short(f)) for f in stack.split(";")} if stack else ():
            total[frame] += int(n)
    keep = [f for f in total if not f.startswith(OUTER) and not ADDRESS.match(f)]
    return [(f, total[f]) for f in sorted(keep, key=lambda f: -total[f])[:count]]


def per_message(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], messages: int
) -> list[tuple[str, float, float, float]]:
    """Each Redis command's calls per message, µs per call and µs per message in the run."""
    rows = []
    for name, stats in after.items():
        calls = stats["calls"] - before.get(name, {}).get("calls", 0)
        usec = stats["usec"] - before.get(name, {}).get("usec", 0)
        if calls > 0:
            rows.append((name.removeprefix("cmdstat_"), calls / messages, usec / calls,
                         usec / messages))  # fmt: skip
    return sorted(rows, key=lambda r: -r[3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name", choices=sorted(SCENARIOS), help="the scenario to profile")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--native", action="store_true", help="C frames too (py-spy --native)")
    parser.add_argument(
        "--gil", action="store_true", help="only the thread holding the GIL (py-spy --gil)"
    )
    parser.add_argument("--top", type=int, default=12, help="frames to print")
    parser.add_argument("--output", type=Path, help="the raw profile (default: a scratch file)")
    args = parser.parse_args()
    out = args.output or scratch_dir("blackbox-profile-") / f"{args.name}.txt"
    watcher = Watcher(out, args.rate, args.native, args.gil)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    result = SCENARIOS[args.name]()
    thread.join(30)
    show = print  # a benchmark prints figures
    show(orjson.dumps(result).decode(), flush=True)
    show(table(result), flush=True)
    if watcher.spy is None:
        show(f"no profile: {watcher.error or 'py-spy never started'}")
        return 1
    _, err = watcher.spy.communicate(timeout=60)
    if not out.exists():
        show(f"no profile: py-spy said {err.decode().strip()}")
        return 1
    samples, frames = top_frames(out, args.top)
    show(f"\nprofile: {out} ({samples} samples at {args.rate}/s, idle threads left out)")
    show(f"  {'self %':>7} {'total %':>8}  frame (self: running; total: on the stack)")
    for frame, own, total in frames:
        show(f"  {100 * own / samples:7.1f} {100 * total / samples:8.1f}  {frame}")
    show("\n  on the stack (total %)")
    for frame, total in inclusive(out, args.top):
        show(f"  {100 * total / samples:7.1f}  {frame}")
    show("\n  phase      messages  service µs/msg  Redis µs/msg (CPU counters, 0.2 s apart)")
    for phase, count, cpu, redis_cpu, _ in watcher.phases():
        if count > 0:
            show(f"  {phase:<10}{count:9d}{cpu / count * 1e6:16.1f}{redis_cpu / count * 1e6:14.1f}")
    for phase, count, _, _, start in watcher.phases():
        if count > 0 and phase == "firing":
            end = watcher.timeline[-1][3]
            show(f"\nredis commandstats while firing, per message fired ({count}):")
            for name, calls, usec_call, usec_msg in per_message(start, end, count):
                show(f"  {name:<18}{calls:10.4f}{usec_call:10.2f}{usec_msg:9.2f}")
    messages = int(str(result.get("messages", 1)))
    show(f"\nredis commandstats over the service's run, per message ({messages}):")
    show(f"  {'command':<18}{'calls/msg':>10}{'µs/call':>10}{'µs/msg':>9}")
    for name, calls, usec_call, usec_msg in per_message(watcher.before, watcher.after, messages):
        show(f"  {name:<18}{calls:10.4f}{usec_call:10.2f}{usec_msg:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

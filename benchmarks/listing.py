"""Listing at 1,000,000 pending: fill Redis with the store's own intake code, then list page
by page through `Pending` (what GET /api/v1/schedules runs) and print the time per page and
Redis's own time per command (from SLOWLOG, every command logged).

    python -m benchmarks.listing [--pending 1000000] [--pages 200] [--shards 1]

With `--shards N` the pending ids are spread over N shards on the one Redis, and every page
merges them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis

from blackbox.api.pending import Filter, Pending
from blackbox.clock import now_ms
from blackbox.dev.servers import RedisServer, free_port, scratch_dir
from blackbox.schedule import Schedule
from blackbox.storage.applying import IntakeSlice
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore

FILL_CHUNK = 10_000


def fill(store: RedisStore, count: int) -> None:
    base = now_ms() + 3_600_000
    for start in range(0, count, FILL_CHUNK):
        items = [
            (i, Schedule(f"@caller-{i % 50}/id-{i}", f"topic-{i % 20}", b'{"n": %d}' % i,
                         base + i * 10, caller=b"caller-%d" % (i % 50)))
            for i in range(start, min(count, start + FILL_CHUNK))
        ]  # fmt: skip
        store.apply([IntakeSlice("bench", 0, items[-1][0], items)], now_ms())


def walk(pending: Pending, kept: Filter, pages: int, limit: int) -> list[float]:
    """Milliseconds per page, following the cursor."""
    times, cursor = [], None
    for _ in range(pages):
        started = time.perf_counter()
        page = pending.page(kept, cursor, limit)
        times.append((time.perf_counter() - started) * 1000)
        cursor = page.cursor
        if cursor is None:
            break
    return times


def longest_command_us(client: redis.Redis) -> str:
    """Redis's own time per command since the last call (every command is logged): p99
    and max over all, and the command that took longest."""
    entries = [e for e in client.slowlog_get(100_000) if b"SLOWLOG" not in e["command"]]
    client.slowlog_reset()
    if not entries:
        return "none"
    durations = sorted(int(e["duration"]) for e in entries)
    longest = max(entries, key=lambda e: int(e["duration"]))
    name = longest["command"].split()[0].decode()
    p99 = durations[max(0, int(len(durations) * 0.99) - 1)]
    return f"{len(durations)} cmds, p99 {p99} us, max {durations[-1]} us ({name})"


def report(name: str, times: list[float], client: redis.Redis) -> None:
    ordered = sorted(times)
    print(  # noqa: T201 - the benchmark's output
        f"{name:<34} pages={len(times):>4}  p50={statistics.median(times):6.2f} ms  "
        f"p99={ordered[int(len(ordered) * 0.99) - 1]:6.2f} ms  max={ordered[-1]:6.2f} ms  "
        f"Redis: {longest_command_us(client)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--shards", type=int, default=1)
    args = parser.parse_args()
    server = RedisServer(free_port(), scratch_dir("blackbox-listing-"))
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        store = RedisStore(client, Layout("bench", args.shards), 604_800)
        started = time.perf_counter()
        fill(store, args.pending)
        print(f"filled {store.counts()[0]:,} pending over {args.shards} shards in "  # noqa: T201
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        pending = Pending(store)
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        report("all, 100 per page", walk(pending, Filter(), args.pages, 100), client)
        middle = Filter(due_from_ms=now_ms() + 3_600_000 + args.pending * 5)
        report("from the middle, 100 per page", walk(pending, middle, args.pages, 100), client)
        report("caller filter (1 in 50)", walk(pending, Filter(caller="caller-7"), args.pages, 100),
               client)  # fmt: skip
        report("rare filter (no match)", walk(pending, Filter(caller="nobody"), args.pages, 100),
               client)  # fmt: skip
        started = time.perf_counter()
        pending.stats()
        print(f"stats: {(time.perf_counter() - started) * 1000:.2f} ms, Redis: "  # noqa: T201
              f"{longest_command_us(client)}")  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()

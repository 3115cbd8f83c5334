"""The requests an Apache Kafka broker serves, by type, and its bytes in and out: read from
the broker's own metrics (`RequestsPerSec` of `kafka.network:type=RequestMetrics`, the
`BytesInPerSec` and `BytesOutPerSec` of `kafka.server:type=BrokerTopicMetrics`).

`java/BrokerRequests.java` reads them over JMX, attached to the broker's JVM by its pid
(Java's attach API: no port opened, no broker setting). It runs as a single source file,
so it needs a JDK (Maven's, which `make` installs); without one, or on Tansu, the figures
are left out (None).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("java") / "BrokerRequests.java"
BYTES = ("BytesInPerSec", "BytesOutPerSec")
# Parts of the Fetch count (the broker counts a consumer's fetches twice: as Fetch and as
# FetchConsumer): left out.
PARTS = ("FetchConsumer", "FetchFollower")


def counts(broker_pid: int) -> dict[str, int] | None:
    """Each request type's count so far, and the bytes in and out; None if unreadable."""
    java = shutil.which("java")
    if java is None:
        return None
    done = subprocess.run([java, str(SOURCE), str(broker_pid)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    if done.returncode != 0:
        print(f"broker requests not read: {done.stderr.strip()[-300:]}", file=sys.stderr)  # noqa: T201
        return None
    return {name: int(count) for name, count in
            (line.split("\t") for line in done.stdout.splitlines() if "\t" in line)}  # fmt: skip


def per_message(
    before: dict[str, int] | None, after: dict[str, int] | None, count: int
) -> dict[str, float] | None:
    """What the broker served between two readings, per message: requests of each type that
    grew (most first), and bytes in and out."""
    if before is None or after is None:
        return None
    grown = {name: after[name] - before.get(name, 0) for name in after if name not in PARTS}
    requests = {n: round(g / count, 3) for n, g in sorted(grown.items(), key=lambda x: -x[1])
                if g > 0 and n not in BYTES}  # fmt: skip
    return {**requests,
            "requests": round(sum(g for n, g in grown.items() if n not in BYTES) / count, 3),
            "bytes_in": round(grown.get("BytesInPerSec", 0) / count, 1),
            "bytes_out": round(grown.get("BytesOutPerSec", 0) / count, 1)}  # fmt: skip

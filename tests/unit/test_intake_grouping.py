"""How intake packs one node's chunks into script calls: grouped on one Redis, up to a
call's bound, a shard and partition never twice in one call; a call per chunk otherwise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from blackbox.storage.applying import (
    GROUPS_PER_CALL,
    SCRIPT_CHUNK,
    Applying,
    IntakeScript,
    _Chunk,
)
from blackbox.storage.keys import Layout


def _session(grouping: bool) -> Applying:
    script = IntakeScript(SimpleNamespace(sha="sha"), Layout("ns", 4), lambda _: None,
                          lambda _due, _now: 60, 86_400)  # fmt: skip
    script.grouping = grouping
    return Applying(script, now_ms=0)


def _chunk(shard: int, requests: int, field: str = "in:0") -> _Chunk:
    keys = [f"k{shard}-{n}" for n in range(5)]
    return _Chunk(keys, [field, shard], list(range(requests)), (field, shard))


def _groups(call: list[Any]) -> int:
    """How many chunks a call's EVALSHA arguments carry."""
    keys = call[1]
    return int(call[2 + keys + 1]) if call[2 + keys] == "*" else 1


def test_chunks_of_other_shards_and_partitions_share_one_call() -> None:
    chunks = [_chunk(0, 3), _chunk(1, 2), _chunk(0, 1, "in:1")]
    calls, positions = _session(grouping=True)._calls(chunks)
    assert [_groups(c) for c in calls] == [3]
    assert positions == [[0, 1, 2, 0, 1, 0]]
    keys = calls[0][1]
    assert calls[0][2 : 2 + keys] == [k for c in chunks for k in c.keys]
    assert calls[0][2 + keys : 2 + keys + 8] == ["*", 3, 5, 2, 5, 2, 5, 2]


def test_a_shard_and_partition_met_again_starts_the_next_call() -> None:
    calls, _ = _session(grouping=True)._calls([_chunk(0, 3), _chunk(1, 2), _chunk(0, 1)])
    assert [_groups(c) for c in calls] == [2, 1]


def test_a_call_carries_at_most_one_calls_worth_of_requests() -> None:
    chunks = [_chunk(0, SCRIPT_CHUNK - 10), _chunk(1, 10), _chunk(2, 1)]
    _, positions = _session(grouping=True)._calls(chunks)
    assert [len(p) for p in positions] == [SCRIPT_CHUNK, 1]


@pytest.mark.parametrize("grouping", [False, True])
def test_without_grouping_or_with_one_chunk_the_single_form_is_sent(grouping: bool) -> None:
    chunks = [_chunk(0, 3), _chunk(1, 2)][: 2 if not grouping else 1]
    calls, _ = _session(grouping)._calls(chunks)
    assert [c[2 + c[1]] for c in calls] == ["in:0"] * len(chunks)


def test_a_call_carries_at_most_so_many_chunks_even_empty_ones() -> None:
    """Chunks that only move a watermark (lagging shards, many partitions) carry no request
    and still cost Redis a read and a write each: a call is bounded by their count too."""
    chunks = [_chunk(n % 4, 0, f"in:{n // 4}") for n in range(GROUPS_PER_CALL * 2 + 1)]
    calls, _ = _session(grouping=True)._calls(chunks)
    assert [_groups(c) for c in calls] == [GROUPS_PER_CALL, GROUPS_PER_CALL, 1]

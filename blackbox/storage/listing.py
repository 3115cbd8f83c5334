"""Listing: one sorted set spread over shards (the due or in-flight set of each), read as one.

A listing walks members in (score, id) order. Redis orders the members of one sorted set by
score, then by the bytes of the member; Python orders str by code point, which for UTF-8 is
the same order, so a k-way merge of the shards' sets yields exactly the order one set would.

Every call is bounded whatever the number pending: all shards are read at once a few members
each, then one shard a step more only when the merge has taken all that was read of it (so
at most one step per shard is read and not taken). The rank each shard starts from costs
O(log n) calls (ZRANK, ZCOUNT), and when many members share the cursor's score (a burst due
at one ms) a search over that tie, reading TIE_PROBES members per shard per round trip:
about log9(tie) round trips, never a walk through the tie.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any

from blackbox.storage.connections import RedisClient

# A member of a listing: (score, id), the order listings walk in.
Member = tuple[int, str]
# Members read per shard per round trip while searching a tie (many ids at one score).
TIE_PROBES = 8


def _member(row: tuple[bytes, float]) -> Member:
    return int(row[1]), row[0].decode("utf-8")


def _rows(reply: Any) -> list[Member]:
    return [_member(row) for row in reply]


def first_ranks(client: RedisClient, names: Sequence[str], below: int) -> list[int]:
    """The rank of each set's first member scored `below` or more (one round trip)."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.zcount(name, "-inf", f"({below}")
    return [int(n) for n in pipe.execute()]


def ranks_after(client: RedisClient, names: Sequence[str], owner: int, after: Member) -> list[int]:
    """The rank of each set's first member ordered after `after`; `owner` is the index of
    the set `after`'s id belongs in (its ZRANK answers at once while it is still there)."""
    score, member = after
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.zcount(name, "-inf", f"({score}")
        pipe.zcount(name, "-inf", score)
    pipe.zrank(names[owner], member)
    pipe.zscore(names[owner], member)
    *counts, rank, found = pipe.execute()
    ties = [(int(counts[2 * i]), int(counts[2 * i + 1])) for i in range(len(names))]
    if rank is not None and found is not None and int(found) == score:
        ties[owner] = (int(rank) + 1, int(rank) + 1)
    return _search_ties(client, names, ties, (score, member.encode("utf-8")))


def _search_ties(
    client: RedisClient,
    names: Sequence[str],
    ties: list[tuple[int, int]],
    after: tuple[int, bytes],
) -> list[int]:
    """Narrow each set's range [low, high) of ranks holding the first member after `after`
    until it is one rank: every round trip probes TIE_PROBES ranks of every open range."""
    while opened := [i for i, (low, high) in enumerate(ties) if low < high]:
        probes = {i: _probes(*ties[i]) for i in opened}
        pipe = client.pipeline(transaction=False)
        for i in opened:
            for rank in probes[i]:
                pipe.zrange(names[i], rank, rank, withscores=True)
        replies = iter(pipe.execute())
        for i in opened:
            ties[i] = _narrowed(ties[i], probes[i], [next(replies) for _ in probes[i]], after)
    return [low for low, _ in ties]


def _probes(low: int, high: int) -> list[int]:
    """Every rank of a short range, else TIE_PROBES ranks spread evenly over it."""
    if high - low <= TIE_PROBES:
        return list(range(low, high))
    return [low + (high - low) * (j + 1) // (TIE_PROBES + 1) for j in range(TIE_PROBES)]


def _narrowed(
    tie: tuple[int, int], ranks: list[int], replies: list[Any], after: tuple[int, bytes]
) -> tuple[int, int]:
    """The range left once the members at `ranks` (ascending) were read: past those at or
    before `after`, up to the first after it (a rank read empty: the set shrank, so it ends)."""
    low, high = tie
    for rank, reply in zip(ranks, replies, strict=True):
        if reply and (int(reply[0][1]), reply[0][0]) <= after:
            low = rank + 1
        else:
            high = min(high, rank)
            break
    return low, max(low, high)


def merged(
    client: RedisClient, names: Sequence[str], starts: Sequence[int], steps: tuple[int, int]
) -> Iterator[Member]:
    """The members of every set from its start rank on, in (score, id) order. `steps`: how
    many of each set the first read takes (all sets in one round trip), and how many more
    of one set each later read takes, when the merge reaches the end of what was read."""
    first, step = steps
    pipe = client.pipeline(transaction=False)
    for name, start in zip(names, starts, strict=True):
        pipe.zrange(name, start, start + first - 1, withscores=True)
    shards = [
        _members(client, name, (start, first), _rows(rows), step)
        for name, start, rows in zip(names, starts, pipe.execute(), strict=True)
    ]
    return heapq.merge(*shards)


def _members(
    client: RedisClient, name: str, read: tuple[int, int], rows: list[Member], step: int
) -> Iterator[Member]:
    """One set's members: `rows` read from `read` (its rank, how many were asked), then
    `step` at a time; a read shorter than asked ends the set."""
    at, asked = read
    while True:
        yield from rows
        if len(rows) < asked:
            return
        at, asked = at + len(rows), step
        rows = _rows(client.zrange(name, at, at + step - 1, withscores=True))

"""benchmarks.layout: each layout's scripts find every id and claim in due order, on a small
redis-server of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from benchmarks import layout
from benchmarks.stack import redis_for


@pytest.fixture
def url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(layout, "SETTLE_S", 0.0)
    monkeypatch.setattr(layout, "RSS_SETTLE_S", 0.0)
    monkeypatch.setattr(layout, "LOOKUPS", 300)
    with redis_for("single") as found:
        yield found


@pytest.mark.parametrize("name", list(layout.LAYOUTS))
def test_a_layout_finds_every_id_and_claims_the_earliest_first(url: str, name: str) -> None:
    # 100 buckets of ~30 for 60 ids a claim: buckets are taken from more than once a claim.
    result = layout.one_run(url, name, 3000, "day", 30, claim_count=3, take=60, caller=b"bench")
    assert result["lookups_found"] == 300
    assert result["overflowed"] in (None, 0)
    for variant in layout.LAYOUTS[name].claims:
        assert result[f"{variant}_taken"] == 180
        assert result[f"{variant}_in_order"], variant
        # The reference beside each id taken (the hashed layouts' bucket found in Lua), or
        # in the member taken.
        in_member = name in ("folded", "folded-lean", "timed")
        assert result[f"{variant}_refs"] == (0 if in_member else 180)
    assert 0 < result["bytes_per_pending"] < 1000


def test_a_folded_lookup_matches_the_whole_id_whatever_its_characters(url: str) -> None:
    client = redis.Redis.from_url(url)
    ref = layout.reference(1, 1_700_000_000_000, b"bench")
    ids = ["a", "ab", "a*", "a?b", "[ab]", "a\\b", "b", "*"]
    for n, schedule_id in enumerate(ids):
        client.zadd(layout.ZSETS + "0", {layout.folded_member(schedule_id, ref): n})
    args = [a for schedule_id in [*ids, "c", "a["] for a in (schedule_id, 0)]
    found = client.eval(layout.LOOKUP_FOLDED, 0, layout.ZSETS, "", *args)
    assert found == [layout.folded_member(i, ref) for i in ids] + [None, None]
    client.close()


def test_ids_are_distinct_and_members_fit_a_listpack_value() -> None:
    ids = {layout.schedule_id(n) for n in range(100_000)}
    assert len(ids) == 100_000 and {len(i) for i in ids} == {layout.ID_CHARS}
    ref = layout.reference(7, 1_700_000_000_000, b"bench")
    assert len(ref) == 33
    assert len(layout.folded_member("x" * 25, ref)) == 59  # zset-max-listpack-value: 64
    assert len(layout.lean_member("x" * 25, ref)) == 51


@pytest.mark.parametrize("name", ["bucketed", "folded"])
def test_a_merged_claim_takes_several_ids_of_a_bucket_in_due_order(url: str, name: str) -> None:
    # 17 buckets of ~60 for 60 ids a claim: most buckets go back among the candidates.
    result = layout.one_run(url, name, 1000, "day", 60, claim_count=5, take=60, caller=b"bench")
    assert result["merge_taken"] == 300 and result["merge_in_order"]
    assert result["strict_taken"] == 300 and result["strict_in_order"]

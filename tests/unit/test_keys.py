"""Key names and shards: pure functions every replica derives alike."""

from __future__ import annotations

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from blackbox.storage.keys import MAX_SHARDS, Keys, Layout


def test_one_shard_keeps_the_namespace_tag() -> None:
    """Scale: a deployment written before shards (one shard) keeps its key names."""
    layout = Layout("bb")
    assert layout.shards == (Keys("bb"),)
    assert layout.shards[0].due == "{bb}:due" and layout.shard_of("anything") == 0


@pytest.mark.parametrize("count", [2, 3, 12, 48])
def test_shard_tags_spread_evenly_over_the_cluster_slots(count: int) -> None:
    """Scale: shard i's slot lies in the i-th of `count` equal slot ranges, so masters
    holding equal slot ranges get equal shares of the shards."""
    layout = Layout("bb", count)
    for index, keys in enumerate(layout.shards):
        slot = key_slot(keys.due.encode())
        assert index * REDIS_CLUSTER_HASH_SLOTS // count <= slot
        assert slot < (index + 1) * REDIS_CLUSTER_HASH_SLOTS // count
        assert key_slot(keys.payload("x").encode()) == slot == key_slot(keys.ended("x").encode())


def test_an_ids_shard_is_stable_and_ids_spread() -> None:
    """Scale: the shard of an id is a pure function of it (an update finds it again), and
    ids spread over every shard."""
    layout = Layout("bb", 8)
    ids = [f"in:0:{o}:abcdefgh" for o in range(8_000)]
    shards = [layout.shard_of(i) for i in ids]
    assert shards == [Layout("bb", 8).shard_of(i) for i in ids]
    counts = [shards.count(s) for s in range(8)]
    assert min(counts) > 900 and max(counts) < 1100


@pytest.mark.parametrize("count", [0, MAX_SHARDS + 1])
def test_a_shard_count_out_of_range_is_refused(count: int) -> None:
    """Settings: no namespace without a shard, nor one with more than MAX_SHARDS."""
    with pytest.raises(ValueError, match="shards must be"):
        Layout("bb", count)

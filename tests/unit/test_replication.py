"""How blackbox's topics should be replicated on a cluster of N brokers, and what a topic
falls short of (kafka/replication.py): pure logic, no broker."""

from __future__ import annotations

import pytest

from blackbox.kafka.replication import MIN_INSYNC, Found, Plan, shortfalls


@pytest.mark.parametrize(
    ("brokers", "copies", "in_sync"), [(0, 1, 1), (1, 1, 1), (2, 2, 1), (3, 3, 2), (7, 3, 2)]
)
def test_the_plan_keeps_three_copies_two_in_sync_where_three_brokers_run(
    brokers: int, copies: int, in_sync: int
) -> None:
    """Guarantee 1: on 3 brokers or more a record counts as written on 2 of 3 copies; on
    fewer, each broker keeps a copy and 1 is enough (the local stack warns of nothing)."""
    assert Plan.for_brokers(brokers) == Plan(copies, in_sync)


def test_a_new_topic_always_names_its_min_insync_replicas() -> None:
    """Written even when 1: a broker whose own default is 2 would otherwise make a topic of
    one or two copies refuse every acks=all write, or stop with one broker down."""
    assert Plan(1, 1).topic_config == {MIN_INSYNC: "1"}
    assert Plan(3, 2).topic_config == {MIN_INSYNC: "2"}


def test_a_topic_short_of_the_plan_names_what_it_falls_short_of() -> None:
    """A topic with fewer copies, or fewer needed in sync, than the plan is named with
    what was found; one at or above it, or whose broker does not tell, is not."""
    planned = Plan(3, 2)
    assert shortfalls(Found(1, 1), planned) == {"replication_factor": 1, "min_insync_replicas": 1}
    assert shortfalls(Found(3, 1), planned) == {"min_insync_replicas": 1}
    assert shortfalls(Found(3, 2), planned) == {}
    assert shortfalls(Found(5, 3), planned) == {}
    assert shortfalls(Found(3, None), planned) == {}

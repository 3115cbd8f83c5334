"""The incarnation of an intake topic: a topic created again under its name starts over."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest
from confluent_kafka import Message

from blackbox.intake.incarnations import TAG_LENGTH, Incarnations, LocalRecord, tag_of
from blackbox.schedule import intake_id
from blackbox.storage.applying import IntakeSlice


@dataclass
class _Record:
    """The three coordinates Incarnations reads of a consumed record."""

    where: tuple[str, int, int]

    def topic(self) -> str:
        return self.where[0]

    def partition(self) -> int:
        return self.where[1]

    def offset(self) -> int:
        return self.where[2]


def _records(*coordinates: tuple[str, int, int]) -> list[Message]:
    return [cast(Message, _Record(c)) for c in coordinates]


class _Lookup:
    """Topic ids as a broker would name them, counting the look-ups."""

    def __init__(self, ids: Mapping[str, str]) -> None:
        self.ids = dict(ids)
        self.calls: list[list[str]] = []

    def __call__(self, names: Sequence[str]) -> dict[str, str]:
        self.calls.append(list(names))
        return {n: self.ids[n] for n in names}


def test_tag_is_the_head_of_the_topic_id_and_empty_without_one() -> None:
    """A broker without topic ids (the zero id) keeps the watermark's old field name."""
    assert tag_of("EhQ/z1NxR8KKabtUjNyf3g") == "EhQ/z1Nx"
    assert tag_of("AAAAAAAAAAAAAAAAAAAAAA") == ""
    assert tag_of(None) == ""


def test_watermark_field_and_derived_id_name_the_incarnation() -> None:
    """A recreated topic's offsets are judged against a watermark of its own, and its
    records get ids of their own (SET NX would otherwise take them for re-reads)."""
    assert IntakeSlice("in", 3, 9, [], "EhQ/z1Nx").field == "in:3:EhQ/z1Nx"
    assert IntakeSlice("in", 3, 9, []).field == "in:3"
    assert intake_id("in", 3, 42, "EhQ/z1Nx") == "in:3:42:EhQ/z1Nx"
    assert intake_id("in", 3, 42) == "in:3:42"


def test_tags_are_looked_up_once_and_again_after_an_assignment() -> None:
    """A new assignment may be a topic created again: its id is asked for anew."""
    lookup = _Lookup({"in": "EhQ/z1NxR8KKabtUjNyf3g"})
    incarnations = Incarnations(lookup)

    assert incarnations.tags(["in"]) == {"in": "EhQ/z1Nx"}
    assert incarnations.tags(["in"]) == {"in": "EhQ/z1Nx"}
    lookup.ids["in"] = "9tJ9oQ5TSYWLN6Lrr4Rw6A"
    incarnations.forget([("in", 0)])

    assert incarnations.tags(["in"]) == {"in": "9tJ9oQ5T"}
    assert lookup.calls == [["in"], ["in"]]


def test_offsets_going_back_cut_the_batch_and_the_id_is_looked_up_again() -> None:
    """librdkafka follows a recreated topic from offset 0 without a new assignment: the
    records before the restart are handled under the old id, the rest after a look-up."""
    lookup = _Lookup({"in": "EhQ/z1NxR8KKabtUjNyf3g"})
    incarnations = Incarnations(lookup)
    incarnations.tags(["in"])
    assert incarnations.admit(_records(("in", 0, 5), ("in", 0, 6))) == 2
    lookup.ids["in"] = "9tJ9oQ5TSYWLN6Lrr4Rw6A"

    assert incarnations.admit(_records(("in", 0, 7), ("in", 0, 0), ("in", 0, 1))) == 1
    incarnations.rewound("in", 0, 0)  # intake reads the rest again
    assert incarnations.admit(_records(("in", 0, 0), ("in", 0, 1))) == 2
    assert incarnations.tags(["in"]) == {"in": "9tJ9oQ5T"}


def test_a_batch_opening_below_the_expected_offset_is_handled_under_a_new_look_up() -> None:
    """The restart seen at a batch's first record: nothing to cut, the id is asked again."""
    lookup = _Lookup({"in": "EhQ/z1NxR8KKabtUjNyf3g"})
    incarnations = Incarnations(lookup)
    incarnations.tags(["in"])
    incarnations.admit(_records(("in", 0, 5)))
    lookup.ids["in"] = "9tJ9oQ5TSYWLN6Lrr4Rw6A"

    assert incarnations.admit(_records(("in", 0, 0))) == 1
    assert incarnations.tags(["in"]) == {"in": "9tJ9oQ5T"}


def test_intakes_own_rewind_is_not_a_restart() -> None:
    """A failed batch read again from its first offset keeps its topic's id."""
    lookup = _Lookup({"in": "EhQ/z1NxR8KKabtUjNyf3g"})
    incarnations = Incarnations(lookup)
    incarnations.tags(["in"])
    incarnations.admit(_records(("in", 0, 5), ("in", 1, 9)))
    incarnations.rewound("in", 0, 5)
    incarnations.rewound("in", 1, 9)

    assert incarnations.admit(_records(("in", 1, 9), ("in", 0, 5))) == 2
    incarnations.tags(["in"])
    assert lookup.calls == [["in"]]


@pytest.mark.parametrize("other", [("in", 1, 0), ("other", 0, 0)])
def test_other_partitions_start_where_they_like(other: Any) -> None:
    """Only a partition's own offsets going back mean a restart."""
    incarnations = Incarnations(_Lookup({}))
    incarnations.admit(_records(("in", 0, 5)))

    assert incarnations.admit(_records(other)) == 1


_ZERO = "AAAAAAAAAAAAAAAAAAAAAA"  # the id of every topic on a broker that gives topics none


def _restart_seen(incarnations: Incarnations, partition: int = 0) -> None:
    """Records of `partition` read under the current tag, then its offsets restart."""
    incarnations.admit(_records(("in", partition, 5)))
    incarnations.tags(["in"])
    incarnations.admit(_records(("in", partition, 0)))


def test_offsets_restarting_under_the_zero_id_take_a_fresh_tag() -> None:
    """Guarantee 1: without topic ids a recreated topic is still a new incarnation: its
    records get a watermark field and ids of their own, never judged as re-reads."""
    incarnations = Incarnations(_Lookup({"in": _ZERO}))
    assert incarnations.tags(["in"]) == {"in": ""}

    _restart_seen(incarnations)
    tag = incarnations.tags(["in"])["in"]

    assert tag.startswith("~") and len(tag) == TAG_LENGTH
    assert incarnations.tags(["in"]) == {"in": tag}


def test_replicas_restarted_on_different_partitions_agree_on_one_tag() -> None:
    """Guarantee 1: each replica sees its own partitions restart; the shared record gives
    them one tag, and a replica assigned the topic afterwards reads it there."""
    record, lookup = LocalRecord(), _Lookup({"in": _ZERO})
    first, second = Incarnations(lookup, record), Incarnations(lookup, record)
    _restart_seen(first, partition=0)
    _restart_seen(second, partition=1)

    tag = first.tags(["in"])["in"]

    assert second.tags(["in"]) == {"in": tag} != {"in": ""}
    assert Incarnations(lookup, record).tags(["in"]) == {"in": tag}


def test_partitions_restarting_one_after_another_take_one_tag() -> None:
    """A partition still read under the old tag restarts from the same recreation: it joins
    the tag its sibling took, not a third one."""
    incarnations = Incarnations(_Lookup({"in": _ZERO}))
    incarnations.admit(_records(("in", 0, 5), ("in", 1, 7)))
    incarnations.tags(["in"])
    incarnations.admit(_records(("in", 0, 0)))
    tag = incarnations.tags(["in"])["in"]

    incarnations.admit(_records(("in", 1, 0)))

    assert incarnations.tags(["in"]) == {"in": tag}


def test_a_new_topic_id_is_its_own_tag_whatever_was_recorded() -> None:
    """A tag recorded against one topic id does not outlive it: a broker that names the
    next incarnation gives its tag, and a restart under it is seen as such."""
    record, lookup = LocalRecord(), _Lookup({"in": "EhQ/z1NxR8KKabtUjNyf3g"})
    incarnations = Incarnations(lookup, record)
    _restart_seen(incarnations)
    assert incarnations.tags(["in"])["in"].startswith("~")

    lookup.ids["in"] = "9tJ9oQ5TSYWLN6Lrr4Rw6A"
    incarnations.forget([("in", 0)])

    assert incarnations.tags(["in"]) == {"in": "9tJ9oQ5T"}

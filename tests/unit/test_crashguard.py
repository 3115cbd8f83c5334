"""The crash guard's pure choices: which records of a poll are handled now after a death, and
how a suspect's count moves (guarantee 4: one record never stops a partition, and no record
is set aside for a death it did not cause)."""

from __future__ import annotations

from confluent_kafka import Message

from blackbox.intake.crashguard import CRASH_LIMIT, Suspect, split

TOPIC = "intake"


def _poll(*where: tuple[int, int]) -> list[Message]:
    """A poll's records, each (partition, offset), in the order given."""
    return [Message(topic=TOPIC, partition=p, offset=o, value=b"v") for p, o in where]


def _where(records: list[Message]) -> list[tuple[int, int]]:
    return [(m.partition() or 0, m.offset() or 0) for m in records]


def test_without_suspects_a_poll_is_handled_whole() -> None:
    """Guarantee 4: the guard costs nothing while no intake died: every record, now."""
    poll = _poll((0, 5), (1, 7), (0, 6))
    now, later = split(poll, {})
    assert (_where(now), later) == ([(0, 5), (1, 7), (0, 6)], [])


def test_a_suspect_record_is_handled_alone_whatever_the_partitions() -> None:
    """Guarantee 4: a suspect record first of its partition is the only record handled: no
    record of another partition shares its poll (it could be the killer)."""
    suspects = {(TOPIC, 3): Suspect(5, 5, 0), (TOPIC, 0): Suspect(5, 6, 1)}
    poll = _poll((3, 5), (0, 5), (0, 6), (1, 9), (3, 6))
    now, later = split(poll, suspects)
    assert _where(now) == [(3, 5)]
    assert _where(later) == [(0, 5), (0, 6), (1, 9), (3, 6)]


def test_records_before_a_suspect_are_handled_together_and_never_past_it() -> None:
    """Guarantee 4: with no suspect record first of its partition, the records before each
    partition's suspect are handled together; the suspect and what follows it wait (its
    partition keeps its order), so a suspect never shares a poll."""
    suspects = {(TOPIC, 0): Suspect(7, 8, 2)}
    poll = _poll((0, 5), (1, 3), (0, 6), (0, 7), (1, 4), (0, 8), (0, 9))
    now, later = split(poll, suspects)
    assert _where(now) == [(0, 5), (1, 3), (0, 6), (1, 4)]
    assert _where(later) == [(0, 7), (0, 8), (0, 9)]


def test_a_suspect_first_in_any_partition_goes_before_the_others() -> None:
    """Guarantee 4: the first suspect record at the head of its partition is taken, even
    behind other partitions' records: suspects are resolved while traffic goes on."""
    suspects = {(TOPIC, 2): Suspect(4, 4, 0)}
    now, later = split(_poll((0, 1), (1, 1), (2, 4), (0, 2)), suspects)
    assert (_where(now), _where(later)) == ([(2, 4)], [(0, 1), (1, 1), (0, 2)])


def test_records_past_the_suspect_range_are_not_suspect() -> None:
    """Guarantee 4: only the offsets noted when the owner died are suspect."""
    suspect = Suspect(10, 12, 1)
    assert [suspect.holds(o) for o in (9, 10, 12, 13)] == [False, True, True, False]


def test_the_count_is_the_charged_record_s_alone() -> None:
    """Guarantee 4: deaths charged to the first suspect record are not carried to the next
    offsets; once a record ended, the rest of the range stays suspect with no charge."""
    suspect = Suspect(10, 12, 2)
    assert suspect.at(10) == suspect
    assert suspect.at(11) == Suspect(11, 12, 0)
    assert suspect.after(10) == Suspect(11, 12, 0)
    assert suspect.after(12) is None


def test_a_record_is_set_aside_after_crash_limit_deaths_alone() -> None:
    """Guarantee 4: poisoned at CRASH_LIMIT charged deaths, its headers read then; once
    setting it aside died too, its headers are left unread (reading them may kill)."""
    below, at, past = (Suspect(3, 3, n) for n in (CRASH_LIMIT - 1, CRASH_LIMIT, CRASH_LIMIT + 1))
    assert (below.poisoned, at.poisoned, past.poisoned) == (False, True, True)
    assert (at.headers_readable, past.headers_readable) == (True, False)


def test_a_note_round_trips_and_a_foreign_one_is_ignored() -> None:
    """Guarantee 4: notes written by the guard are read back; anything else is no note."""
    assert Suspect.decode(Suspect(5, 9, 0).encode().encode()) == Suspect(5, 9, 0)
    assert Suspect.decode(b"5 9") is None
    assert Suspect.decode("a b c") is None

"""benchmarks.ab's reading of a run's figures and of the A side's settings."""

from __future__ import annotations

import math

import pytest

from benchmarks.ab import assignments, field

RESULT = {"last_after_due_ms": 602, "own_lateness_ms": {"p50": 1, "p99": 5}, "broker": "kafka"}


def test_a_field_is_read_at_the_top_or_inside_a_nested_object() -> None:
    assert field(RESULT, "last_after_due_ms") == 602.0
    assert field(RESULT, "own_lateness_ms.p99") == 5.0


@pytest.mark.parametrize("name", ["missing", "own_lateness_ms.p90", "broker", "broker.p50"])
def test_a_field_absent_or_not_a_number_reads_as_nan(name: str) -> None:
    assert math.isnan(field(RESULT, name))


def test_base_env_takes_name_value_pairs_the_value_may_hold_equals_signs() -> None:
    assert assignments(["BLACKBOX_SHARDS=1", "X=a=b", "EMPTY="]) == {
        "BLACKBOX_SHARDS": "1",
        "X": "a=b",
        "EMPTY": "",
    }


@pytest.mark.parametrize("written", ["BLACKBOX_SHARDS", "=1"])
def test_base_env_refuses_what_is_not_name_value(written: str) -> None:
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        assignments([written])

"""IntakeConfig: what the intake reads, how much at once, and what it accepts."""

from __future__ import annotations

from dataclasses import dataclass, field

from blackbox.envelope import Limits
from blackbox.intake.gaps import GapConfig
from blackbox.intake.policy import CallerPolicy

# How long intake gathers records after the first of a poll, while more keep coming (see
# loop.py's _consume): BLACKBOX_INTAKE_WINDOW_MS.
WINDOW_SECONDS = 0.025


@dataclass(frozen=True, slots=True)
class IntakeConfig:
    """What the intake reads, how much at once, and what it accepts."""

    topics: tuple[str, ...]  # the shared intake topic, then the callers' own
    batch: int
    dlq_topic: str
    events_topic: str
    limits: Limits
    policy: CallerPolicy
    gaps: GapConfig = field(default_factory=GapConfig)
    window_s: float = WINDOW_SECONDS  # gathering records after a poll's first (_consume)

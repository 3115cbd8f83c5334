"""Every Redis key blackbox uses. Nothing else builds key names (the claim script joins
the prefixes `payload("")` and `ended("")` it is handed to the ids it takes).

All keys of one namespace share the hash tag ``{namespace}``, so each Lua script touches a
single slot and runs unchanged on Redis Cluster. Names are short on purpose: a pending
message costs one payload key and one sorted-set member, and millions may be pending.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one blackbox namespace."""

    namespace: str = "bb"
    # Built once: payload() and ended() run once per message on the intake and firing paths.
    tag: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tag", "{" + self.namespace + "}")

    @property
    def due(self) -> str:
        """Sorted set: schedule id -> due time (epoch ms)."""
        return f"{self.tag}:due"

    @property
    def in_flight(self) -> str:
        """Sorted set: schedule id -> lease expiry (epoch ms) of the replica firing it."""
        return f"{self.tag}:fly"

    @property
    def attempts(self) -> str:
        """Hash: schedule id -> delivery attempts that failed or were interrupted."""
        return f"{self.tag}:try"

    @property
    def wake_channel(self) -> str:
        """Pub/sub channel: a due time (epoch ms) sooner than replicas may have planned for."""
        return f"{self.tag}:wake"

    @property
    def intake_marks(self) -> str:
        """Hash: "topic:partition" -> highest intake offset already handled."""
        return f"{self.tag}:in"

    def payload(self, schedule_id: str) -> str:
        """String (SET ... EX): the encoded Schedule of one id. Kept short: one per message.

        Ids never start with ':' or '!', so these never meet the other names of the namespace."""
        return self.tag + schedule_id

    def ended(self, schedule_id: str) -> str:
        """String (SET ... EX): how a caller's id last ended, "f" fired or "c" cancelled.

        Kept for BLACKBOX_FIRED_RETENTION so a late cancel can answer already_fired."""
        return f"{self.tag}!{schedule_id}"

"""Role: which parts one `blackbox run` process runs, so intake and firing scale apart.

`all` (the default) consumes the intake topic and fires; `intake` only consumes it into
Redis (answering and dead-lettering), never fires; `dispatch` only fires what is due (and
returns expired leases), never joins the intake consumer group. Every role serves the HTTP
endpoints and probes the dependencies it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

# The body of one of a part's threads (intake's consumer, firing's waker, ...).
Loop = Callable[[], None]


class Role(StrEnum):
    """A process's share of the work."""

    ALL = "all"
    INTAKE = "intake"
    DISPATCH = "dispatch"

    @property
    def takes_intake(self) -> bool:
        """It joins the intake consumer group and stores what arrives."""
        return self is not Role.DISPATCH

    @property
    def fires(self) -> bool:
        """It fires due messages: the waker, the safety-net tick and the lease reclaim."""
        return self is not Role.INTAKE

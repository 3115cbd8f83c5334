"""Relaying: a caller's request about its own id (cancel, reschedule, pause, resume) sent
through the intake topic as the caller's records are, and the HTTP answer made of what the
intake answered.

Each such request holds a worker thread while it waits (up to twice
BLACKBOX_DELIVERY_TIMEOUT): at most INTAKE_WAITS wait at once, and INTAKE_WAITS_PER_CALLER
of one caller (`Waits`); the rest are answered 503 at once, so the other routes keep
threads and one caller's load never refuses another's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from fastapi.responses import JSONResponse

from blackbox import envelope
from blackbox.api.backend import Backend
from blackbox.api.errors import ApiError, refusal
from blackbox.api.views import Answer
from blackbox.kafka.events import Outcome
from blackbox.schedule import split_scoped

# A caller's own id, as intake reads it.
MAX_OWN_ID_CHARS = envelope.MAX_ID_CHARS
STATUS = {
    Outcome.CANCELLED: 200, Outcome.UPDATED: 200, Outcome.ALREADY_FIRED: 409,
    Outcome.NOT_FOUND: 404, Outcome.DEAD_LETTERED: 422, Outcome.PAUSED: 200,
    Outcome.RESUMED: 200, Outcome.NOT_RECURRING: 409, Outcome.RECURRING: 409,
}  # fmt: skip
# A pause or resume of a series cancelled before changes nothing: a conflict, not a success.
HOLD_STATUS = {**STATUS, Outcome.CANCELLED: 409}
# Requests waiting at once for the intake's answer: half of AnyIO's 40 worker threads, which
# every sync route shares; one caller holds at most a quarter of them, so one caller's load
# never refuses another's requests.
INTAKE_WAITS = 20
INTAKE_WAITS_PER_CALLER = 5


class Waits:
    """The requests of one app waiting for the intake's answer: at most `most` at once, and
    at most `per_caller` of one caller."""

    def __init__(self, most: int = INTAKE_WAITS, per_caller: int = INTAKE_WAITS_PER_CALLER) -> None:
        self.most, self.per_caller = most, per_caller
        self._lock = threading.Lock()
        self._held: dict[bytes | None, int] = {}

    @contextmanager
    def taken(self, caller: bytes | None = None) -> Iterator[bool]:
        """Whether this request of `caller` may wait (its place held until the end of the
        block)."""
        with self._lock:
            held = self._held.get(caller, 0)
            if held >= self.per_caller or sum(self._held.values()) >= self.most:
                allowed = False
            else:
                allowed, self._held[caller] = True, held + 1
        if not allowed:
            yield False
            return
        try:
            yield True
        finally:
            with self._lock:
                self._held[caller] -= 1
                if not self._held[caller]:
                    del self._held[caller]


def through_intake(
    backend: Backend, waits: Waits, blackbox_id: str, request: dict[str, Any],
    statuses: dict[Outcome, int] = STATUS,
) -> JSONResponse:  # fmt: skip
    """Send a caller's request about its id as the caller would; answer what intake did
    (503 with Retry-After when INTAKE_WAITS requests, or INTAKE_WAITS_PER_CALLER of this
    caller's, wait already)."""
    scoped = split_scoped(blackbox_id)
    assert scoped is not None  # only a caller's own id comes here
    own = scoped[1]
    if not own or len(own) > MAX_OWN_ID_CHARS or not own.isprintable():
        # Refused by intake, its answer keyed by the id cut short: never waited for.
        raise ApiError(422, "invalid_id",
                       f"an id is 1-{MAX_OWN_ID_CHARS} printable characters")  # fmt: skip
    with waits.taken(scoped[0]) as waiting:
        if not waiting:
            return refusal(503, "unavailable", "too many requests wait for the intake's "
                           "answers already: try again", {"retry-after": "1"})  # fmt: skip
        return _sent_to_intake(backend, blackbox_id, scoped, request, statuses)


def _sent_to_intake(
    backend: Backend, blackbox_id: str, scoped: tuple[bytes | None, str],
    request: dict[str, Any], statuses: dict[Outcome, int],
) -> JSONResponse:  # fmt: skip
    caller, own = scoped
    answers = backend.answers
    if answers is not None and not answers.ready(backend.answer_seconds):
        raise ApiError(503, "unavailable", "the events topic cannot be read: try again")
    with answers.expecting(own.encode()) if answers is not None else nullcontext():
        where = backend.admin.request(caller, own, {"id": own, **request})
        answer = None if answers is None else answers.wait(where, backend.answer_seconds)
    if answer is None:
        raise ApiError(504, "no_answer_yet", f"the request is in {where[0]!r} partition "
                       f"{where[1]} offset {where[2]} and will be applied in order; its answer "
                       "will be on the events topic")  # fmt: skip
    outcome = Outcome(answer["outcome"])
    if outcome is Outcome.DEAD_LETTERED:
        raise ApiError(422, str(answer.get("reason")), str(answer.get("detail")))
    return answer_of(outcome, blackbox_id, answer.get("due_ms"), statuses)


def answer_of(
    outcome: Outcome, blackbox_id: str, due_ms: int | None,
    statuses: dict[Outcome, int] = STATUS,
) -> JSONResponse:  # fmt: skip
    """200 with the outcome; otherwise an error body that also carries the outcome."""
    body: dict[str, Any] = Answer(outcome=outcome.value, blackbox_id=blackbox_id,
                                  due_ms=due_ms).model_dump()  # fmt: skip
    status = statuses.get(outcome, 404)
    if status != 200:
        body |= {"error": outcome.value, "reason": f"{blackbox_id[:200]!r}: {outcome.value}"}
    return JSONResponse(body, status_code=status)

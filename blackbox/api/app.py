"""The HTTP API (/api/v1) and the admin page (/), beside /live, /ready and /metrics.

A FastAPI app: the OpenAPI document (/openapi.json) is generated from the typed models in
`views`. Every bad request is answered 4xx with a JSON body (see `errors`); Redis or the
broker away is 503, never a 500.

A token acts for the callers it was given (tokens.py; checked in access.py). A change to
a caller's id (cancel, reschedule, pause, resume) travels through the intake topic keyed by
the id, as the caller's own records do, so it is applied in their order; the API answers
with what the intake answered (relay.py, which also bounds how many such requests wait at
once); the probes need no worker thread.

A recurring schedule (a series) is one pending id, like a one-off schedule: `GET
/schedules` lists both (each item's `series` tells them apart; `kind=one_off` or
`kind=series` keeps one sort), and `GET /series` lists series alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from importlib import resources
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import Field

from blackbox import envelope
from blackbox.api import errors
from blackbox.api.backend import Backend
from blackbox.api.deadletters import DeadLetters
from blackbox.api.errors import ApiError
from blackbox.api.guard import BodyGate, OpenHosts
from blackbox.api.pending import Filter
from blackbox.api.relay import HOLD_STATUS, Waits, answer_of, through_intake
from blackbox.api.tokens import Grant
from blackbox.api.views import (
    Answer,
    Created,
    Detail,
    ErrorBody,
    Kind,
    Lateness,
    LatenessBucket,
    NewSchedule,
    Page,
    State,
    Stats,
    When,
)
from blackbox.clock import now_ms
from blackbox.errors import InvalidEnvelope
from blackbox.health import Health
from blackbox.kafka.events import Outcome
from blackbox.metrics import Metrics
from blackbox.schedule import split_scoped
from blackbox.tracecontext import TRACE_HEADERS
from blackbox.version import version

PREFIX = "/api/v1"
MAX_LIMIT = 500
MAX_ID_CHARS = 1024


@dataclass(frozen=True, slots=True)
class Call:
    """One call's backend and what its token may do."""

    backend: Backend
    grant: Grant
    waits: Waits  # its app's requests waiting for the intake

    def owned(self, blackbox_id: str) -> tuple[bool, str | None]:
        """(whether it is a caller's own id, its caller) of an id the token acts for.

        An id of another caller is answered as one that is not there, the same 404 after
        the same work: a caller's own id names its caller, checked before any read; for an
        id derived from an intake record, whether it is pending and whose it is come from
        one bounded read of its payload's head, whatever its message's size."""
        scoped = split_scoped(blackbox_id)
        if scoped is not None:
            caller = None if scoped[0] is None else scoped[0].decode()
        else:
            pending, owner = self.backend.pending.owner(blackbox_id)
            caller = None if owner is None else owner.decode("utf-8", "replace")
            if not pending:
                raise not_found(blackbox_id)
        if not self.grant.acts_for(caller):
            raise not_found(blackbox_id)
        return scoped is not None, caller

    def check_every_caller(self) -> None:
        if self.grant.callers is not None:
            raise ApiError(403, "forbidden", "totals across callers need a token for every caller")


def not_found(blackbox_id: str) -> ApiError:
    """The one answer for an id that is not pending and for an id the token may not see."""
    return ApiError(404, "not_found", f"no pending schedule {blackbox_id[:200]!r}")


_bearer = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
BlackboxId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def reader(request: Request, credentials: Credentials) -> Call:
    backend = _backend(request)
    return Call(backend, backend.access.check(credentials, read=True), request.app.state.waits)


def writer(request: Request, credentials: Credentials) -> Call:
    backend = _backend(request)
    return Call(backend, backend.access.check(credentials, read=False), request.app.state.waits)


Reader = Annotated[Call, Depends(reader)]
Writer = Annotated[Call, Depends(writer)]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1,
                                              max_length=255)]  # fmt: skip
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 503)
}
router = APIRouter(prefix=PREFIX, responses=ERRORS)


CallerQuery = Annotated[str | None, Query(max_length=255)]
TopicQuery = Annotated[str | None, Query(max_length=255)]
# A sealed position: the longest stored id (a caller of 255 characters, percent-encoded,
# and its own id of 255) in base64, with the seal's 28 bytes.
CursorQuery = Annotated[str | None, Query(max_length=8192)]
LimitQuery = Annotated[int, Query(ge=1, le=MAX_LIMIT)]


@router.get("/schedules", response_model=Page)
def list_schedules(  # noqa: PLR0913, PLR0917 - the query's filters, each by name
    call: Reader,
    state: State = State.PENDING,
    caller: CallerQuery = None,
    topic: TopicQuery = None,
    due_from_ms: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    due_to_ms: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    cursor: CursorQuery = None,
    limit: LimitQuery = 100,
    kind: Kind = Kind.ALL,
) -> Page:
    """Pending schedules by due time (in flight: by lease expiry), a page at a time.

    Series are pending ids too, listed here with the rest (`kind=all`, the default; an
    item's `series` holds its rule and next occurrences); `kind=one_off` keeps only one-off
    schedules, `kind=series` only series (as `GET /series`). A call reads at most a bounded
    number of ids: a filter that matches rarely may answer fewer items than `limit` with a
    `cursor` to go on from."""
    kept = Filter(state, _listed_caller(call.grant, caller), topic, due_from_ms, due_to_ms,
                  kind)  # fmt: skip
    return call.backend.pending.page(kept, cursor, limit)


@router.get("/series", response_model=Page)
def list_series(  # noqa: PLR0913, PLR0917 - the query's filters, each by name
    call: Reader,
    state: State = State.PENDING,
    caller: CallerQuery = None,
    topic: TopicQuery = None,
    cursor: CursorQuery = None,
    limit: LimitQuery = 100,
) -> Page:
    """Pending series (recurring schedules) by the due time of the occurrence each has
    stored, a page at a time, each with its rule, how many occurrences have fired, whether
    it is paused and its next occurrences. Paged and guarded as `GET /schedules`: series
    are read from among every pending id, so a page may hold fewer than `limit` with a
    `cursor` to go on from."""
    kept = Filter(state, _listed_caller(call.grant, caller), topic, kind=Kind.SERIES)
    return call.backend.pending.page(kept, cursor, limit)


def _listed_caller(grant: Grant, caller: str | None) -> str | None:
    """The caller a listing keeps: any for a token of every caller; else its own."""
    if grant.callers is None:
        return caller
    if caller is None:
        if grant.sole_caller is None:
            several = "this token acts for several callers: name one with ?caller="
            raise ApiError(400, "caller_required", several)
        return grant.sole_caller
    if not grant.acts_for(caller):
        raise ApiError(403, "forbidden", f"this token does not act for {caller[:200]!r}")
    return caller


@router.post("/schedules/{blackbox_id:path}/reschedule", response_model=Answer)
def reschedule(blackbox_id: BlackboxId, when: When, call: Writer) -> JSONResponse:
    """Move a pending schedule to a new due time (an `updated` event); a message being
    produced right now answers `already_fired`. A caller's id is moved through the intake
    topic, after every record of that id sent before, within the caller's horizon."""
    backend = call.backend
    due_ms = _due_ms(when, backend.max_countdown_ms)
    own, caller = call.owned(blackbox_id)
    if own:
        chosen = {k: v for k, v in when.model_dump().items() if v is not None}
        return through_intake(backend, call.waits, blackbox_id, {"reschedule": True, **chosen})
    backend.admin.check_horizon(caller, due_ms)
    moved = backend.admin.reschedule(blackbox_id, due_ms)
    return answer_of(moved.outcome, blackbox_id, due_ms if moved.schedule else None)


@router.post("/schedules/{blackbox_id:path}/pause", response_model=Answer)
def pause(blackbox_id: BlackboxId, call: Writer) -> JSONResponse:
    """Hold a series: `paused` (200); its occurrences falling due while paused are passed
    over, none delivered. `not_recurring` (409) for a one-off schedule, `not_found` (404),
    `already_fired` (409) for a series ended by its limit or end, `cancelled` (409). Sent
    through the intake topic, after every record of that id sent before."""
    return _hold(call, blackbox_id, paused=True)


@router.post("/schedules/{blackbox_id:path}/resume", response_model=Answer)
def resume(blackbox_id: BlackboxId, call: Writer) -> JSONResponse:
    """Release a paused series: `resumed` (200); it delivers every occurrence due from then
    on. Other answers as for pause."""
    return _hold(call, blackbox_id, paused=False)


def _hold(call: Call, blackbox_id: str, *, paused: bool) -> JSONResponse:
    """Pause or resume through the intake; an id derived from an intake record is never a
    series (a series has the caller's own id)."""
    own, _ = call.owned(blackbox_id)
    if not own:
        return answer_of(Outcome.NOT_RECURRING, blackbox_id, None)
    verb = "pause" if paused else "resume"
    return through_intake(call.backend, call.waits, blackbox_id, {verb: True}, HOLD_STATUS)


@router.get("/schedules/{blackbox_id:path}", response_model=Detail)
def get_schedule(blackbox_id: BlackboxId, call: Reader) -> Detail:
    """One pending schedule with its whole message (base64 when binary) and headers; a
    series with its rule and next occurrences (`item.series`)."""
    call.owned(blackbox_id)
    found = call.backend.pending.get(blackbox_id)
    if found is None:
        raise not_found(blackbox_id)
    return found


@router.delete("/schedules/{blackbox_id:path}", response_model=Answer)
def cancel(blackbox_id: BlackboxId, call: Writer) -> JSONResponse:
    """Cancel: `cancelled` (200), `already_fired` (409) or `not_found` (404), exactly as
    an intake cancel answers, with the same event on the events topic. A caller's id is
    cancelled through the intake topic, after every record of that id sent before."""
    own, _ = call.owned(blackbox_id)
    if own:
        return through_intake(call.backend, call.waits, blackbox_id, {"cancel": True})
    return answer_of(call.backend.admin.cancel(blackbox_id), blackbox_id, None)


def _as_the_intake_reads(document: dict[str, Any]) -> dict[str, Any]:
    """The envelope's numbers as the intake's reader (orjson) reads their text: a whole
    number beyond 64 bits is a double there (10**30 is 1e30, 10**400 infinite), so the API
    refuses it for the reason the intake gives, never as text it cannot encode."""
    return {name: _intake_number(value) for name, value in document.items()}


def _intake_number(value: object) -> object:
    if type(value) is int and not -(2**63) <= value < 2**64:
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, dict):
        return _as_the_intake_reads(value)
    if isinstance(value, list):
        return [_intake_number(v) for v in value]
    return value


def _finite(value: object) -> bool:
    """Whether every number in a JSON value is finite (Python's JSON reader, unlike the
    intake's, reads NaN, Infinity and 1e400; written again they would become null)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


@router.post("/schedules", status_code=202, response_model=Created)
def create(
    body: NewSchedule, call: Writer, request: Request, idempotency_key: IdempotencyKey = None
) -> Created:
    """Produce an envelope to the intake topic as `caller` (the token's own caller when it
    acts for one): the caller's policy and answers are those of any producer. With an
    `Idempotency-Key` (the schedule's id when the envelope has none), a retried create
    never schedules twice, even once the first one fired. The request's W3C trace context
    (`traceparent`, `tracestate`, `baggage`) goes with it to the delivered record."""
    caller = body.caller or call.grant.sole_caller
    if not call.grant.acts_for(caller):
        raise ApiError(403, "forbidden", f"this token does not act for {caller!r}")
    document = _as_the_intake_reads(dict(body.envelope))
    if not _finite(document):
        raise ApiError(422, "invalid_json", "numbers must be finite: NaN, Infinity and "
                       "values beyond a double (1e400) are not JSON blackbox reads")  # fmt: skip
    if idempotency_key is not None:
        document = {"id": idempotency_key, **document, "if_absent": True}
    try:
        blackbox_id = call.backend.admin.create(caller, document, _trace_context(request))
    except InvalidEnvelope as e:
        raise ApiError(422, e.reason.value, e.detail) from e
    except (orjson.JSONEncodeError, UnicodeEncodeError) as e:  # lone surrogates in the JSON
        raise ApiError(422, "invalid_text", f"not encodable as UTF-8 JSON: {e}") from e
    topic = call.backend.admin.topic_for(caller)
    return Created(blackbox_id=blackbox_id, intake_topic=topic)


def _trace_context(request: Request) -> list[envelope.Header]:
    """The HTTP request's trace headers, as sent (the intake checks and counts them)."""
    found = ((name, request.headers.getlist(name)) for name in TRACE_HEADERS)
    return [(name, value.encode("latin-1")) for name, values in found for value in values]


@router.get("/stats", response_model=Stats)
def stats(call: Reader) -> Stats:
    """Counts, pending per due bucket ahead, and the next due per target topic."""
    call.check_every_caller()
    return call.backend.pending.stats()


@router.get("/dead-letters", response_model=DeadLetters)
def dead_letters(
    call: Reader, limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50
) -> DeadLetters:
    """The most recent dead letters (read back from the dead-letter topic), newest first."""
    call.check_every_caller()
    return DeadLetters(items=call.backend.dead_letters.recent(limit))


@router.get("/lateness", response_model=Lateness)
def lateness(call: Reader) -> Lateness:
    """This replica's delivery lateness histogram: cumulative count per upper bound (s)."""
    call.check_every_caller()
    return Lateness(buckets=_histogram(call.backend.metrics, "blackbox_lateness_seconds"))


def _histogram(metrics: Metrics, name: str) -> list[LatenessBucket]:
    for family in metrics.registry.collect():
        if family.name == name:
            return [LatenessBucket(le=s.labels["le"], count=s.value)
                    for s in family.samples if s.name.endswith("_bucket")]  # fmt: skip
    return []


def _due_ms(when: When, max_countdown_ms: int) -> int:
    """The due time `when` names, checked as the intake checks an envelope's."""
    chosen = {k: v for k, v in when.model_dump().items() if v is not None}
    document = orjson.dumps({"topic": "t", "message": "", **chosen})
    try:
        request = envelope.parse(document, [], envelope.Limits(len(document), frozenset()))
    except InvalidEnvelope as e:
        raise ApiError(422, e.reason.value, e.detail) from e
    now = now_ms()
    due = request.due_ms(now) if isinstance(request, envelope.Envelope) else now
    if due > now + max_countdown_ms:
        raise ApiError(422, "beyond_horizon", "later than BLACKBOX_MAX_COUNTDOWN from now")
    return due


def _health_routes(app: FastAPI, health: Health, metrics: Metrics) -> None:
    """/live, /ready and /metrics, answered as they always were. The probes read what the
    health thread found, on the event loop: no worker thread, so busy routes never keep them
    waiting. /metrics reads Redis (the pending gauges): it stays on a thread."""

    def probe(ok: bool) -> Response:
        body = orjson.dumps(health.report())
        return Response(body, 200 if ok else 503, media_type="application/json")

    async def live() -> Response:
        return probe(health.live)

    async def ready() -> Response:
        return probe(health.ready)

    app.add_api_route("/live", live, include_in_schema=False)
    app.add_api_route("/ready", ready, include_in_schema=False)
    app.add_api_route(
        "/metrics",
        lambda: Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST),
        include_in_schema=False,
    )


def probes_app(health: Health, metrics: Metrics) -> FastAPI:
    """/live, /ready and /metrics alone: for checks that need no Redis or broker."""
    app = FastAPI(openapi_url=None)
    _health_routes(app, health, metrics)
    return app


def _page_routes(app: FastAPI) -> None:
    """The admin page: plain files shipped in the package, no build step, no CDN; its
    footer names the release (as /metrics does, to anyone who reaches the port)."""
    folder = resources.files("blackbox.api") / "page"
    page = (folder / "index.html").read_text("utf-8").replace("{{version}}", escape(version()))
    app.add_api_route("/", lambda: HTMLResponse(page), include_in_schema=False)
    app.mount("/page", StaticFiles(directory=str(folder)), name="page")


def create_app(backend: Backend) -> FastAPI:
    app = FastAPI(title="blackbox", version="1", summary="Delayed messages for Kafka: "
                  "see and manage what is pending.", openapi_url="/openapi.json",
                  docs_url=None, redoc_url=None)  # fmt: skip
    app.state.backend = backend
    app.state.waits = Waits()
    errors.install(app)
    app.include_router(router)
    _health_routes(app, backend.health, backend.metrics)
    _page_routes(app)
    if backend.access.open:
        app.add_middleware(OpenHosts, allowed=backend.access.hosts)
    # Added last, so it runs first: the token and the size before any body is read.
    app.add_middleware(BodyGate, authorize=backend.access.check_write,
                       limit=backend.max_body_bytes, seconds=backend.body_seconds)  # fmt: skip
    return app

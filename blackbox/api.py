"""The HTTP API (/api/v1) and the admin page (/), beside /live, /ready and /metrics.

A FastAPI app: the OpenAPI document (/openapi.json) is generated from the typed
models below and in `pending`. Every bad request is answered 4xx with a JSON body (see
`httperrors`); Redis or the broker away is 503, never a 500.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from blackbox import envelope, httperrors, kafka
from blackbox.admin import Admin
from blackbox.clock import now_ms
from blackbox.dlqtail import DeadLetterTail, DeadLetterView
from blackbox.errors import InvalidEnvelope
from blackbox.events import Outcome
from blackbox.guard import BodyGate, OpenHosts
from blackbox.health import Health
from blackbox.httperrors import ApiError
from blackbox.metrics import Metrics
from blackbox.pending import Detail, Filter, Page, Pending, PendingGauges, State, Stats
from blackbox.settings import Settings
from blackbox.shares import Nudge
from blackbox.store import RedisStore

PREFIX = "/api/v1"
MAX_LIMIT = 500
MAX_ID_CHARS = 1024
# Bodies are envelopes: the largest message, base64-encoded, plus room for the rest.
BODY_OVERHEAD_BYTES = 65_536
_STATUS = {
    Outcome.CANCELLED: 200, Outcome.UPDATED: 200, Outcome.ALREADY_FIRED: 409,
    Outcome.NOT_FOUND: 404,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call what: the bearer token, whether reads need it, the local-dev bypass, and
    the Host names answered besides the local ones while some call needs no token."""

    token: str
    reads_open: bool
    dev_open: bool
    hosts: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Access(token={'********' if self.token else ''!r}, reads_open={self.reads_open})"

    @property
    def open(self) -> bool:
        """Whether some call needs no token (then only the Host names served are answered)."""
        return self.reads_open or (self.dev_open and not self.token)

    def check(self, credentials: HTTPAuthorizationCredentials | None, *, read: bool) -> None:
        if read and self.reads_open:
            return
        if not self.token:
            if self.dev_open:
                return
            raise ApiError(403, "disabled", "set BLACKBOX_API_TOKEN to use this endpoint")
        given = b"" if credentials is None else credentials.credentials.encode()
        if not hmac.compare_digest(given, self.token.encode()):
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <BLACKBOX_API_TOKEN>")

    def check_write(self, authorization: str | None) -> None:
        """`check` for a call that changes something, from its Authorization header alone."""
        scheme, given = get_authorization_scheme_param(authorization)
        bearer = scheme.lower() == "bearer" and bool(given)
        credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=given)
        self.check(credentials if bearer else None, read=False)


@dataclass(frozen=True, slots=True)
class Backend:
    """What the routes act on."""

    pending: Pending
    admin: Admin
    dead_letters: DeadLetterTail
    health: Health
    metrics: Metrics
    access: Access
    max_countdown_ms: int
    max_body_bytes: int

    def close(self) -> None:
        self.admin.producer.flush(1.0)
        self.dead_letters.close()


class ErrorBody(BaseModel):
    error: str
    reason: str


class Answer(BaseModel):
    """What became of a cancel or a reschedule, as the events topic tells it."""

    outcome: str
    blackbox_id: str
    due_ms: int | None = None


class When(BaseModel):
    """A new due time: exactly one of `deliver_at` (RFC 3339 with an offset, or epoch
    seconds) and `countdown` (seconds from now)."""

    model_config = ConfigDict(extra="forbid")
    deliver_at: str | float | None = None
    countdown: float | None = None


class NewSchedule(BaseModel):
    """An intake envelope (as producers send it) and the CALLER_SERVICE to send it as."""

    model_config = ConfigDict(extra="forbid")
    caller: str | None = Field(default=None, min_length=1, max_length=255)
    envelope: dict[str, Any]


class Created(BaseModel):
    """The id the schedule will have; its answer arrives on the events topic."""

    blackbox_id: str
    intake_topic: str


class LatenessBucket(BaseModel):
    le: str
    count: float


class Lateness(BaseModel):
    buckets: list[LatenessBucket]


class DeadLetters(BaseModel):
    items: list[DeadLetterView]


_bearer = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
BlackboxId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def reader(request: Request, credentials: Credentials) -> Backend:
    backend = _backend(request)
    backend.access.check(credentials, read=True)
    return backend


def writer(request: Request, credentials: Credentials) -> Backend:
    backend = _backend(request)
    backend.access.check(credentials, read=False)
    return backend


Reader = Annotated[Backend, Depends(reader)]
Writer = Annotated[Backend, Depends(writer)]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 503)
}
router = APIRouter(prefix=PREFIX, responses=ERRORS)


@router.get("/schedules", response_model=Page)
def list_schedules(  # noqa: PLR0913, PLR0917 - the query's filters, each by name
    backend: Reader,
    state: State = State.PENDING,
    caller: Annotated[str | None, Query(max_length=255)] = None,
    topic: Annotated[str | None, Query(max_length=255)] = None,
    due_from_ms: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    due_to_ms: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
) -> Page:
    """Pending schedules by due time (in flight: by lease expiry), a page at a time.

    A call reads at most a bounded number of ids: a filter that matches rarely may answer
    fewer items than `limit` with a `cursor` to go on from."""
    kept = Filter(state, caller, topic, due_from_ms, due_to_ms)
    return backend.pending.page(kept, cursor, limit)


@router.post("/schedules/{blackbox_id:path}/reschedule", response_model=Answer)
def reschedule(blackbox_id: BlackboxId, when: When, backend: Writer) -> JSONResponse:
    """Move a pending schedule to a new due time (an `updated` event); a message being
    produced right now answers `already_fired`."""
    due_ms = _due_ms(when, backend.max_countdown_ms)
    moved = backend.admin.reschedule(blackbox_id, due_ms)
    return _answer(moved.outcome, blackbox_id, due_ms if moved.schedule else None)


@router.get("/schedules/{blackbox_id:path}", response_model=Detail)
def get_schedule(blackbox_id: BlackboxId, backend: Reader) -> Detail:
    """One pending schedule with its whole message (base64 when binary) and headers."""
    found = backend.pending.get(blackbox_id)
    if found is None:
        raise ApiError(404, "not_found", f"no pending schedule {blackbox_id[:200]!r}")
    return found


@router.delete("/schedules/{blackbox_id:path}", response_model=Answer)
def cancel(blackbox_id: BlackboxId, backend: Writer) -> JSONResponse:
    """Cancel: `cancelled` (200), `already_fired` (409) or `not_found` (404), exactly as
    an intake cancel answers, with the same event on the events topic."""
    return _answer(backend.admin.cancel(blackbox_id), blackbox_id, None)


@router.post("/schedules", status_code=202, response_model=Created)
def create(body: NewSchedule, backend: Writer) -> Created:
    """Produce an envelope to the intake topic as `caller`: the caller's policy,
    idempotency and answers are those of any producer."""
    try:
        blackbox_id = backend.admin.create(body.caller, body.envelope)
    except InvalidEnvelope as e:
        raise ApiError(422, e.reason.value, e.detail) from e
    except (orjson.JSONEncodeError, UnicodeEncodeError) as e:  # lone surrogates in the JSON
        raise ApiError(422, "invalid_text", f"not encodable as UTF-8 JSON: {e}") from e
    return Created(blackbox_id=blackbox_id, intake_topic=backend.admin.intake_topic)


@router.get("/stats", response_model=Stats)
def stats(backend: Reader) -> Stats:
    """Counts, pending per due bucket ahead, and the next due per target topic."""
    return backend.pending.stats()


@router.get("/dead-letters", response_model=DeadLetters)
def dead_letters(
    backend: Reader, limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50
) -> DeadLetters:
    """The most recent dead letters (read back from the dead-letter topic), newest first."""
    return DeadLetters(items=backend.dead_letters.recent(limit))


@router.get("/lateness", response_model=Lateness)
def lateness(backend: Reader) -> Lateness:
    """This replica's delivery lateness histogram: cumulative count per upper bound (s)."""
    return Lateness(buckets=_histogram(backend.metrics, "blackbox_lateness_seconds"))


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


def _answer(outcome: Outcome, blackbox_id: str, due_ms: int | None) -> JSONResponse:
    """200 with the outcome; otherwise an error body that also carries the outcome."""
    body: dict[str, Any] = Answer(outcome=outcome.value, blackbox_id=blackbox_id,
                                  due_ms=due_ms).model_dump()  # fmt: skip
    status = _STATUS.get(outcome, 404)
    if status != 200:
        body |= {"error": outcome.value, "reason": f"{blackbox_id[:200]!r}: {outcome.value}"}
    return JSONResponse(body, status_code=status)


def _health_routes(app: FastAPI, health: Health, metrics: Metrics) -> None:
    """/live, /ready and /metrics, answered as they always were."""

    def probe(ok: bool) -> Response:
        body = orjson.dumps(health.report())
        return Response(body, 200 if ok else 503, media_type="application/json")

    app.add_api_route("/live", lambda: probe(health.live), include_in_schema=False)
    app.add_api_route("/ready", lambda: probe(health.ready), include_in_schema=False)
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
    """The admin page: plain files shipped in the package, no build step, no CDN."""
    folder = resources.files("blackbox") / "page"
    app.add_api_route(
        "/", lambda: FileResponse(str(folder / "index.html")), include_in_schema=False
    )
    app.mount("/page", StaticFiles(directory=str(folder)), name="page")


def create_app(backend: Backend) -> FastAPI:
    app = FastAPI(title="blackbox", version="1", summary="Delayed messages for Kafka: "
                  "see and manage what is pending.", openapi_url="/openapi.json",
                  docs_url=None, redoc_url=None)  # fmt: skip
    app.state.backend = backend
    httperrors.install(app)
    app.include_router(router)
    _health_routes(app, backend.health, backend.metrics)
    _page_routes(app)
    if backend.access.open:
        app.add_middleware(OpenHosts, allowed=backend.access.hosts)
    # Added last, so it runs first: the token and the size before any body is read.
    app.add_middleware(BodyGate, authorize=backend.access.check_write,
                       limit=backend.max_body_bytes)  # fmt: skip
    return app


def backend_of(
    settings: Settings, store: RedisStore, health: Health, metrics: Metrics,
    on_scheduled: Nudge,
) -> Backend:  # fmt: skip
    """The API's parts for one service; the pending gauges join its metrics."""
    pending = Pending(store)
    limits = envelope.Limits(settings.max_message_bytes, frozenset(settings.own_topics))
    metrics.registry.register(PendingGauges(pending))
    admin = Admin(store, kafka.new_producer(settings), settings.intake_topic,
                  settings.events_topic, limits,
                  kafka.topic_id_lookup(settings.kafka), on_scheduled)  # fmt: skip
    return Backend(
        pending=pending, admin=admin,
        dead_letters=DeadLetterTail(kafka.consumer_config(settings), settings.dlq_topic),
        health=health, metrics=metrics,
        access=Access(settings.api_token, settings.api_reads == "open", settings.api_dev_open,
                      settings.api_allowed_hosts),
        max_countdown_ms=int(settings.max_countdown * 1000),
        max_body_bytes=settings.max_message_bytes * 2 + BODY_OVERHEAD_BYTES,
    )  # fmt: skip

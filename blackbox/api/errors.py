"""HTTP errors of the API: every refusal is a 4xx JSON body `{"error": ..., "reason": ...}`,
a dependency away is 503, and nothing is left to become a 500. (What is refused before the
body is read, `guard` refuses.)"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import redis
import structlog
from confluent_kafka import KafkaException
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from blackbox.errors import BadCursor, ConcurrentUpdate, CorruptSchedule

log = structlog.get_logger("blackbox.api.errors")


class ApiError(Exception):
    """A request refused with `status`, a short `error` code and a readable `reason`."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def refusal(
    status: int, error: str, reason: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status_code=status, headers=headers)


async def _on_api_error(_request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ApiError)
    return refusal(e.status, e.error, e.reason)


async def _on_invalid(_request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
    first = e.errors()[0] if e.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    return refusal(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}")


async def _on_http(_request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, HTTPException)
    name = HTTPStatus(e.status_code).phrase.lower().replace(" ", "_")
    return refusal(e.status_code, name, str(e.detail))


async def _on_unavailable(_request: Request, e: Exception) -> JSONResponse:
    log.warning("api_dependency_unavailable", error=str(e))
    return refusal(503, "unavailable", f"{type(e).__name__}: {str(e)[:300]}")


async def _on_conflict(_request: Request, e: Exception) -> JSONResponse:
    return refusal(409, "conflict", str(e))


async def _on_corrupt(_request: Request, e: Exception) -> JSONResponse:
    return refusal(422, "unreadable", str(e))


async def _on_bad_cursor(_request: Request, e: Exception) -> JSONResponse:
    return refusal(400, "bad_cursor", str(e))


def install(app: FastAPI) -> None:
    """Answer every refusal and dependency failure with a JSON error, never a 500."""
    handlers: list[tuple[type[Exception], Any]] = [
        (ApiError, _on_api_error), (RequestValidationError, _on_invalid),
        (HTTPException, _on_http), (redis.RedisError, _on_unavailable),
        (KafkaException, _on_unavailable), (ConcurrentUpdate, _on_conflict),
        (CorruptSchedule, _on_corrupt), (BadCursor, _on_bad_cursor),
    ]  # fmt: skip
    for kind, handler in handlers:
        app.add_exception_handler(kind, handler)

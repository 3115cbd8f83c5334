"""schemathesis against the served OpenAPI document: whatever it sends, the API answers
within its own schema and never with a 5xx."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.conftest import ServiceFactory

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          content_type_conformance]  # fmt: skip


@pytest.fixture
def api_schema(start_service: ServiceFactory) -> Any:
    service = start_service(BLACKBOX_API_DEV_OPEN="true")
    assert service.endpoints is not None
    return schemathesis.openapi.from_url(f"http://127.0.0.1:{service.endpoints.port}/openapi.json")


def test_the_api_keeps_to_its_schema(api_schema: Any) -> None:
    """Every operation, fed generated requests (25 each), answers a documented status with
    a body of its documented schema, and never a server error."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)  # fmt: skip
        def check(case: Any) -> None:
            case.call_and_validate(checks=CHECKS)

        check()

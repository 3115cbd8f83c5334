"""The HTTP API's guard on the real service and its uvicorn (guarantee 4: bodies are bounded
and authenticated before they are read; an open API answers only the Host names it serves)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson

from blackbox.version import version
from tests.integration.conftest import ServiceFactory
from tests.integration.test_api import AUTH, TOKEN, api
from tests.kafkatools import wait_until

PART = 64 * 1024
TOTAL = 64 * 1024 * 1024
# What the sockets between client and server hold once the server stops reading (about
# 3 MiB measured here): a server that read the whole body would have taken all of TOTAL.
HELD_IN_BUFFERS = 16 * 1024 * 1024


class Stream:
    """A chunked request body of TOTAL bytes that counts how much of it the client sent."""

    def __init__(self) -> None:
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        part = b"x" * PART
        while self.sent < TOTAL:
            self.sent += PART
            yield part


def test_a_chunked_body_without_the_token_is_refused_before_it_is_read(
    start_service: ServiceFactory,
) -> None:
    """A 64 MiB chunked POST without the token (or with a wrong one) is answered 401 from
    its headers; the server reads next to nothing of it and stays up."""
    with api(start_service(BLACKBOX_API_TOKEN=TOKEN)) as client:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
            body = Stream()
            refused = client.post("/api/v1/schedules", content=body, headers=headers)
            assert (refused.status_code, refused.json()["error"]) == (401, "unauthorized")
            assert body.sent <= HELD_IN_BUFFERS, f"{body.sent:,} bytes taken"
            assert refused.headers["connection"] == "close"
        assert client.get("/live").status_code == 200


def test_a_chunked_body_over_the_limit_is_refused_413_as_it_streams(
    start_service: ServiceFactory,
) -> None:
    """With the token, a chunked body is counted as it streams in: past the limit (twice the
    largest message plus 64 KiB) it is 413 and nothing more is read; a chunked body within
    the limit is read whole and scheduled."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_MAX_MESSAGE_BYTES="1000")
    with api(service) as client:
        body = Stream()
        refused = client.post("/api/v1/schedules", content=body, headers=AUTH)
        assert (refused.status_code, refused.json()["error"]) == (413, "too_large")
        assert body.sent <= HELD_IN_BUFFERS, f"{body.sent:,} bytes taken"
        document = orjson.dumps({"envelope": {"topic": "t", "message": "m", "countdown": 60}})
        parts = iter([document[:10], document[10:]])  # chunked, under the limit
        json = {**AUTH, "Content-Type": "application/json"}
        created = client.post("/api/v1/schedules", content=parts, headers=json)
        assert created.status_code == 202, created.text


def test_an_open_api_answers_only_the_hosts_it_serves(start_service: ServiceFactory) -> None:
    """Reads open: a Host other than localhost, 127.0.0.1, [::1] and the configured names is
    refused 400 (DNS rebinding), the probes excepted; likewise every call of a dev-open API.
    An API whose every call needs the token answers any Host."""
    service = start_service(BLACKBOX_API_READS="open", BLACKBOX_API_ALLOWED_HOSTS="bb.example")
    with api(service) as client:
        for host in ("localhost", "127.0.0.1:1234", "[::1]", "bb.example"):
            assert _stats(client, host).status_code == 200, host
        assert _stats(client, "attacker.example").status_code == 400
        assert client.get("/live", headers={"Host": "10.0.0.9:8080"}).status_code == 200
    with api(start_service(BLACKBOX_API_DEV_OPEN="true")) as client:
        evil = {"Host": "attacker.example"}
        assert client.delete("/api/v1/schedules/@a/b", headers=evil).status_code == 400
        assert client.delete("/api/v1/schedules/@a/b").status_code == 404
    with api(start_service(BLACKBOX_API_TOKEN=TOKEN)) as client:
        assert _stats(client, "blackbox.internal", AUTH).status_code == 200


def test_the_probes_answer_the_pod_address_whatever_the_api_refuses(
    start_service: ServiceFactory,
) -> None:
    """The kubelet and Prometheus name the pod by its address: with the API open (reads
    open, or dev open) and that Host refused on /api/v1, /live, /ready and /metrics answer
    an IPv4 or IPv6 address as Host (with a trailing slash, a redirect to the probe), and
    /metrics holds the release (blackbox_build_info)."""
    for opened in ({"BLACKBOX_API_READS": "open"}, {"BLACKBOX_API_DEV_OPEN": "true"}):
        service = start_service(**opened)
        wait_until(lambda: service.health.ready, 30, "the service ready")  # noqa: B023
        with api(service) as client:
            for host in ("10.0.0.9:8080", "[fd00:10:244::9]:8080"):
                assert _stats(client, host).status_code == 400, (opened, host)
                for probe in ("/live", "/ready", "/metrics"):
                    answer = client.get(probe, headers={"Host": host})
                    assert answer.status_code == 200, (opened, host, probe)
                    moved = client.get(probe + "/", headers={"Host": host})
                    assert moved.status_code == 307, (opened, host, probe)
                    assert httpx.URL(moved.headers["location"]).path == probe
            metrics = client.get("/metrics", headers={"Host": "10.0.0.9:8080"}).text
            assert f'blackbox_build_info{{version="{version()}"}} 1.0' in metrics


def _stats(client: httpx.Client, host: str, auth: dict[str, str] | None = None) -> httpx.Response:
    return client.get("/api/v1/stats", headers={"Host": host, **(auth or {})})

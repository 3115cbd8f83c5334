"""Secrets are never shown by the real `blackbox` processes: a recognizable secret planted in
every setting and file that can hold one appears nowhere in what `blackbox run`,
`create-topics` and the API commands write, whether they start, refuse or fail."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackbox.api.tokens import digest
from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.signing import new_key_pair
from tests.integration.conftest import service_env
from tests.kafkatools import wait_until
from tests.process import BlackboxProcess

PLANTED = "PLANTED-s3cr3t-9f2c"  # 19 characters: a valid token and password
SHORT = PLANTED[:12]  # too short a token; any secret shown holds it
KAFKA_SECRETS = ("SASL_PASSWORD", "SSL_KEY_PASSWORD", "SASL_OAUTHBEARER_CLIENT_SECRET")


@pytest.fixture
def guarded_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis that asks for the planted password, as a production Redis asks for one."""
    server = RedisServer(free_port(), tmp_path, config={"requirepass": PLANTED})
    server.start()
    yield server
    server.stop()


def _status(url: str, token: str | None = None) -> int:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - http on loopback
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _planted_environment(redis: RedisServer, broker: KafkaBroker, files: Path) -> dict[str, str]:
    """Every secret blackbox reads, planted: Redis's password, Kafka credentials for each
    client, the API token, a tokens file's hash and the API's signing key."""
    pem, _public = new_key_pair()
    (files / "key.pem").write_bytes(pem)
    (files / "tokens.yaml").write_text(
        f"tokens:\n  - name: ops\n    sha256: {digest(PLANTED + '-ops')}\n    callers: [a]\n"
    )
    kafka = {f"{prefix}{name}": PLANTED for prefix in ("KAFKA_", "KAFKA_CONSUMER_",
             "KAFKA_PRODUCER_") for name in KAFKA_SECRETS}  # fmt: skip
    return service_env(
        f"redis://:{PLANTED}@127.0.0.1:{redis.port}/0", broker.bootstrap, **kafka,
        BLACKBOX_HTTP_PORT=str(free_port()), BLACKBOX_API_TOKEN=PLANTED,
        BLACKBOX_API_TOKENS_FILE=str(files / "tokens.yaml"),
        BLACKBOX_API_SIGNING_KEY_FILE=str(files / "key.pem"), BLACKBOX_LOG_LEVEL="debug",
    )  # fmt: skip


def _secrets_in(output: str, files: Path) -> list[str]:
    """Which planted secrets `output` shows: the secret (or its first 12 characters), the
    token hash, or a line of the signing key."""
    key_lines = [line for line in (files / "key.pem").read_text().splitlines()
                 if not line.startswith("-----")]  # fmt: skip
    shown = [s for s in (SHORT, digest(PLANTED + "-ops"), *key_lines) if s in output]
    return [s[:8] + "..." for s in shown]


def test_a_running_service_shows_none_of_its_secrets(
    guarded_redis: RedisServer, broker: KafkaBroker, tmp_path: Path
) -> None:
    """`blackbox run` with every secret planted starts, serves the API to the right token
    and refuses a wrong one, and stops; `create-topics` and `blackbox list` run with the
    same settings: none of their output holds a secret (the start logs every setting)."""
    env = _planted_environment(guarded_redis, broker, tmp_path)
    topics = BlackboxProcess(env, tmp_path / "topics.log", "create-topics")
    assert topics.wait(60) == 0, topics.output()
    service = BlackboxProcess(env, tmp_path / "run.log", "run")
    site = f"http://127.0.0.1:{env['BLACKBOX_HTTP_PORT']}"
    try:
        wait_until(lambda: _status(f"{site}/ready") == 200, 60, "the service to be ready")
        assert _status(f"{site}/api/v1/schedules", PLANTED) == 200
        assert _status(f"{site}/api/v1/schedules", PLANTED[::-1]) == 401
        listing = BlackboxProcess({**env, "BLACKBOX_API_URL": site}, tmp_path / "list.log",
                                  "list")  # fmt: skip
        assert listing.wait(30) == 0, listing.output()
    finally:
        code = service.terminate(30)
    assert code == 0
    for run in ("topics", "run", "list"):
        output = (tmp_path / f"{run}.log").read_text(errors="replace")
        assert "service_starting" in output or run != "run"
        assert _secrets_in(output, tmp_path) == [], f"{run}: {output[-2000:]}"


def test_a_refused_or_failing_start_shows_no_secret(
    guarded_redis: RedisServer, broker: KafkaBroker, tmp_path: Path
) -> None:
    """A token too short, a malformed Redis URL and a Redis that refuses the password: each
    start fails or waits, saying why, and shows no secret; nor does `blackbox send` refusing
    a signing key file that holds no key."""
    env = _planted_environment(guarded_redis, broker, tmp_path)
    short = BlackboxProcess({**env, "BLACKBOX_API_TOKEN": SHORT}, tmp_path / "a.log")
    assert short.wait(30) == 2
    assert "BLACKBOX_API_TOKEN" in short.output()
    bad_url = {**env, "REDIS_URL": f"redis://:{PLANTED}@127.0.0.1:notaport/0"}
    malformed = BlackboxProcess(bad_url, tmp_path / "b.log")
    assert malformed.wait(30) == 2
    assert "REDIS_URL" in malformed.output()
    wrong = {**env, "REDIS_URL": f"redis://:{PLANTED}x@127.0.0.1:{guarded_redis.port}/0"}
    refused = BlackboxProcess(wrong, tmp_path / "c.log")
    try:
        wait_until(lambda: "invalid username-password pair" in refused.output(), 60,
                   "Redis's refusal to be logged")  # fmt: skip
    finally:
        if refused.process.poll() is None:
            refused.terminate(30)
        else:
            refused.wait()
    (tmp_path / "bad.pem").write_text(f"-----BEGIN PRIVATE KEY-----\n{PLANTED}\n"
                                      "-----END PRIVATE KEY-----\n")  # fmt: skip
    signed = BlackboxProcess(env, tmp_path / "d.log", "send", "--signing-key",
                             str(tmp_path / "bad.pem"), "--key-id", "k1", "--caller", "c",
                             "--topic", "t", "--countdown", "60", '"x"')  # fmt: skip
    assert signed.wait(30) == 2
    assert "--signing-key" in signed.output()
    for process in (short, malformed, refused, signed):
        assert _secrets_in(process.output(), tmp_path) == [], process.output()[-2000:]

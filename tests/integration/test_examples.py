"""The site's sending examples (examples/), run as a user runs them, deliver through blackbox;
the read-back the README and the Quick start print shows what was sent.

Each runs against a blackbox whose intake topic has several partitions, so a producer that
partitions keys otherwise than Java's murmur2 shows up: the Python and kcat records must sit
on their key's murmur2 partition, and the Java and Go examples sign their records, which
blackbox takes only there (and only with a valid signature from a listed key).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.signing import public_text
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import Received, unique

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PARTITIONS = 3
KEY_ID = "billing-examples"
# Go is where the machine's toolchain puts it when it is not on PATH.
GO_PLACES = ("/usr/local/go/bin/go",)


def _tool(name: str, *places: str) -> str:
    """A tool the examples need; never skipped: `make setup` installs them."""
    found = shutil.which(name) or next((p for p in places if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.fail(f"{name} is not installed (make system-packages installs it)")
    return found


def _run(command: list[str], env: dict[str, str], cwd: Path = ROOT, timeout: float = 240) -> None:
    done = subprocess.run(command, cwd=cwd, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip
    assert done.returncode == 0, f"{command[0]} failed:\n{done.stdout}\n{done.stderr}"


def _service(start_service: ServiceFactory, env: dict[str, str], **overrides: str) -> Settings:
    """A blackbox whose intake topic has several partitions (created before it starts)."""
    settings = Settings.from_env({**env, **overrides})
    clients.ensure_topics(settings.kafka, [settings.intake_topic], partitions=PARTITIONS)
    start_service(**overrides)
    return settings


def _delivered(reader: ReaderFactory, target: str, invoice: int) -> None:
    (record,) = reader(target).wait_count(1, timeout=60)
    assert orjson.loads(record.value or b"") == {"invoice": invoice}
    assert record.header("CALLER_SERVICE") == "billing"
    assert record.header("blackbox-id") == f"@billing/invoice-{invoice}"


def _on_murmur2_partition(reader: ReaderFactory, intake: str) -> None:
    (record,) = reader(intake).wait_count(1)
    assert record.key is not None
    assert record.partition == clients.java_partition(record.key, PARTITIONS)


@pytest.mark.parametrize(
    ("example", "invoice"), [("send_later.py", 42), ("send_raw.py", 43)]
)  # fmt: skip
def test_python_examples_deliver(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    example: str, invoice: int,
) -> None:  # fmt: skip
    """The Python examples, run as scripts, schedule a message that is delivered, keyed
    on its murmur2 partition."""
    settings = _service(start_service, env)
    target = unique("invoices")
    _run([sys.executable, str(EXAMPLES / "python" / example), target], env)
    _delivered(reader, target, invoice)
    _on_murmur2_partition(reader, settings.intake_topic)


def test_python_client_example_schedules_and_cancels(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """The client tour on the Sending page: two schedules and a cancel, each answered."""
    settings = _service(start_service, env)
    _run([sys.executable, str(EXAMPLES / "python" / "client.py")], env)
    events = reader(settings.events_topic).wait_count(3)
    answers = [orjson.loads(e.value or b"") for e in events]
    assert sorted(a["outcome"] for a in answers) == ["cancelled", "scheduled", "scheduled"]
    assert {a["id"] for a in answers if a["outcome"] == "cancelled"} == {"invoice-42"}


def test_kcat_example_delivers(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """The kcat example schedules a message that is delivered, keyed on its murmur2
    partition."""
    settings = _service(start_service, env)
    target = unique("invoices")
    _run([_tool("sh"), str(EXAMPLES / "kcat" / "send.sh"), target], env)
    _delivered(reader, target, 44)
    _on_murmur2_partition(reader, settings.intake_topic)


@pytest.fixture
def signing(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A caller key pair: the examples' environment naming the private half, and a policy
    that requires billing's records to be signed with the public half."""
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "billing.pem"
    pem.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      f"    keys: {{{KEY_ID}: \"{public_text(key.public_key())}\"}}\n")  # fmt: skip
    return {"BLACKBOX_SIGNING_KEY": str(pem), "BLACKBOX_KEY_ID": KEY_ID}, policy


@pytest.mark.timeout(400)
def test_java_example_delivers_signed(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    signing: tuple[dict[str, str], Path], tmp_path: Path,
) -> None:  # fmt: skip
    """The Java example, with its one Maven dependency (kafka-clients), signs its record and
    blackbox, which requires billing's signature, delivers it."""
    keys, policy = signing
    _service(start_service, env, BLACKBOX_POLICY_FILE=str(policy))
    lib, target = tmp_path / "lib", unique("invoices")
    _run([_tool("mvn"), "-q", "-B", "-f", str(EXAMPLES / "java" / "pom.xml"),
          "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
          f"-DoutputDirectory={lib}"], env)  # fmt: skip
    _run([_tool("java"), "-cp", f"{lib}/*", str(EXAMPLES / "java" / "SendLater.java"), target],
         env | keys)  # fmt: skip
    _delivered(reader, target, 45)


@pytest.mark.timeout(400)
def test_go_example_delivers_signed(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    signing: tuple[dict[str, str], Path], tmp_path: Path,
) -> None:  # fmt: skip
    """The Go example, with its one dependency (segmentio/kafka-go and its Murmur2Balancer),
    signs its record and blackbox, which requires billing's signature, delivers it."""
    keys, policy = signing
    _service(start_service, env, BLACKBOX_POLICY_FILE=str(policy))
    binary, target = tmp_path / "send-later", unique("invoices")
    _run([_tool("go", *GO_PLACES), "build", "-o", str(binary), "."], env, cwd=EXAMPLES / "go",
         timeout=360)  # fmt: skip
    _run([str(binary), target], env | keys)
    _delivered(reader, target, 46)


# What the docs print: the dev stack's broker and the README's target topic, replaced in a
# test by its own broker and a topic of its own.
PRINTED_BROKER, PRINTED_TOPIC = "127.0.0.1:9092", "orders"
SHELL = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _printed(page: Path, start: str) -> list[str]:
    """The words of the first command a page prints in a `sh` block that starts so."""
    for block in SHELL.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith(start):
                return shlex.split(line.split(" # ", 1)[0])
    raise AssertionError(f"{page.name} prints no command starting {start!r}")


def _here(words: list[str], bootstrap: str, topic: str) -> list[str]:
    swap = {PRINTED_BROKER: bootstrap, PRINTED_TOPIC: topic}
    return [swap.get(word, word) for word in words]


def _as_kcat_prints(record: Received) -> bytes:
    """The record as `-f 'headers: %h\\nvalue: %s\\n'` prints it."""
    headers = ",".join(f"{k}={(v or b'').decode()}" for k, v in record.headers.items())
    return b"headers: " + headers.encode() + b"\nvalue: " + (record.value or b"") + b"\n"


@pytest.mark.parametrize("page", ["README.md", "docs/quick-start.md"])
def test_printed_read_back_shows_the_sent_message(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], page: str
) -> None:
    """The read-back a page prints after its `blackbox send`, run as printed with Debian's
    kcat once the message is due, shows that message byte for byte and exits."""
    start_service()
    target, bootstrap = unique("orders"), env["KAFKA_BOOTSTRAP_SERVERS"]
    send = _here(_printed(ROOT / page, ".venv/bin/blackbox send"), bootstrap, target)
    _run([sys.executable, "-m", "blackbox", *send[1:]], env)
    (record,) = reader(target).wait_count(1, timeout=60)
    assert record.value == orjson.dumps(orjson.loads(send[-1]))
    read_back = _here(_printed(ROOT / page, "kcat "), bootstrap, target)
    assert "-C" in read_back, read_back
    shown = subprocess.run([_tool("kcat"), *read_back[1:]], capture_output=True, timeout=30,
                           check=True)  # fmt: skip
    assert shown.stdout == _as_kcat_prints(record)

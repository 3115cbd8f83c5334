"""The commands the guide pages print (the Guide of mkdocs.yml's nav: docs/quick-start.md,
sending.md, recurring.md, http-api.md and the pages beside them), each run as printed, in
the clone with its .venv/bin first on PATH, against a service of the test's own (one per
page, none where a command needs none): each exits as its page says, and does what the page
says (what it sends is stored as sent and delivered; what it prints is what the page shows).

A page's commands are those of its `sh` blocks (a `\\` continuation joined, comments left
out) and those it prints inline in its prose (a code span starting with a program, with at
least two words after it). Each is run by a test here (RUN) or named in SKIPPED with the
reason, so a command added to a page without a test fails the first test."""

from __future__ import annotations

import base64
import csv
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

from blackbox.api.views import utc_text
from blackbox.cli.listing import NOTHING, SCHEDULE_COLUMNS, SERIES_COLUMNS
from blackbox.clock import now_ms
from blackbox.dev.stack import DEV_PARTITIONS
from blackbox.kafka import clients
from blackbox.service import Service
from blackbox.signing import private_pem, public_text
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import TopicReader, unique, wait_until

ROOT = Path(__file__).resolve().parents[2]
# The printed `blackbox` is the clone's, first on PATH: `make setup` made it, as `make run` does.
BIN = ROOT / ".venv" / "bin"
PAGES = ("docs/quick-start.md", "docs/sending.md", "docs/answers.md", "docs/recurring.md",
         "docs/retries.md", "docs/dead-letters.md", "docs/http-api.md", "docs/callers.md",
         "docs/SIGNING.md", "docs/spark.md", "docs/migrating.md")  # fmt: skip
TOKEN = "guide-token-0123456789abcdef"  # noqa: S105 - a test token

# docs/sending.md, its `sh` block.
CANCEL = "blackbox cancel invoice-42 --caller billing"
SEND = """blackbox send --topic invoices --countdown 3600 --id invoice-42 --caller billing '{"invoice": 42}'"""  # noqa: E501
SHOW = "blackbox show @billing/invoice-42"
RESCHEDULE = "blackbox reschedule @billing/invoice-42 --countdown 600"
LIST = "blackbox list --caller billing"
SEND_AT = "blackbox send --topic invoices --at 2030-01-01T00:00:00Z --key 42 --header trace=abc --text hello"  # noqa: E501
SEND_BINARY = "blackbox send --topic files --countdown 60 --binary ./report.pdf"
SEND_FILE = "blackbox send --file schedules.jsonl --caller billing"
SEND_WAIT = """blackbox send --topic invoices --countdown 60 --id inv-7 --caller billing --wait 10 '{"n": 7}'"""  # noqa: E501
ONE_ID = (CANCEL, SEND, SHOW, RESCHEDULE, LIST)
SENDS = (SEND_AT, SEND_BINARY, SEND_FILE, SEND_WAIT)

# docs/recurring.md, inline.
SERIES_SEND = """blackbox send --topic reports --id daily --caller billing --cron "0 9 * * 1-5" --timezone Europe/Berlin '"run"'"""  # noqa: E501
PAUSE = "blackbox pause daily --caller billing"
RESUME = "blackbox resume daily --caller billing"
LIST_SERIES = "blackbox list --series"
SERIES = (SERIES_SEND, PAUSE, LIST_SERIES, RESUME)

# docs/http-api.md, its `sh` block.
EXPORT = "export TOKEN=..."
_CURL = 'curl -H "Authorization: Bearer $TOKEN"'
_JSON = "-H 'Content-Type: application/json'"
CURL_LIST = f"{_CURL} 'localhost:8080/api/v1/schedules?caller=billing&limit=20'"
CURL_NEXT = f'{_CURL} "localhost:8080/api/v1/schedules?caller=billing&cursor=$CURSOR"'
CURL_GET = f"{_CURL} localhost:8080/api/v1/schedules/@billing/invoice-42"
CURL_DELETE = f"{_CURL} -X DELETE localhost:8080/api/v1/schedules/@billing/invoice-42"
CURL_RESCHEDULE = (f"""{_CURL} {_JSON} -d '{{"countdown": 600}}' """
                   "localhost:8080/api/v1/schedules/@billing/invoice-42/reschedule")  # fmt: skip
CURL_CREATE = (f"""{_CURL} {_JSON} -d '{{"caller": "billing", "envelope": {{"topic": "invoices", """
               """"message": {"n": 42}, "countdown": 3600, "id": "invoice-42"}}' """
               "localhost:8080/api/v1/schedules")  # fmt: skip
CURL_STATS = f"{_CURL} localhost:8080/api/v1/stats"
CURLS = (CURL_CREATE, CURL_LIST, CURL_NEXT, CURL_GET, CURL_RESCHEDULE, CURL_STATS, CURL_DELETE)

# docs/callers.md and SIGNING.md, inline.
KEYS_NEW = "blackbox keys new --key-id billing-2026-11 --out billing.pem"

# docs/quick-start.md, its `sh` blocks (the first send printed twice).
ORDER = """.venv/bin/blackbox send --topic orders --countdown 5 --caller billing '{"order": 1}'"""
ORDER_7 = """.venv/bin/blackbox send --topic orders --countdown 600 --id order-7 --caller billing '{"order": 7}'"""  # noqa: E501
CANCEL_7 = ".venv/bin/blackbox cancel order-7 --caller billing"
CANCEL_8 = ".venv/bin/blackbox cancel order-8 --caller billing"
TOMBSTONE = ("echo 'order-7:' | kcat -b 127.0.0.1:9092 -P -t blackbox -K: -Z "
             "-H CALLER_SERVICE=billing -X partitioner=murmur2_random")  # fmt: skip
ORDERS = (ORDER, ORDER_7, CANCEL_7, CANCEL_8, TOMBSTONE)

# docs/SIGNING.md, its `sh` block.
PUBLIC_HALF = "openssl pkey -in billing.pem -pubout"
OPENSSL_SIGN = ("openssl pkeyutl -sign -inkey billing.pem -rawin -in signed.txt "
                "| basenc --base64url | tr -d '=\\n'")  # fmt: skip

# docs/spark.md, the `sh` block of `--show`: the command, then the record it prints.
SPARK_SHOW = ("blackbox spark schedule reminders.csv --caller reminders --id user_id "
              "--topic-column topic --message payload --due local_time --zone-column zone "
              "--dry-run --show 1")  # fmt: skip
SHOWN = r'{"topic": "blackbox", "key": "000123", "headers": [["CALLER_SERVICE", "reminders"]], "value": {"topic":"remind.email","id":"000123","message":"{\"user\": 0, \"text\": \"é✓ rappel, \\\"quoted\\\"\"}","deliver_at":"2026-11-24T08:00:00.000+00:00"}}'  # noqa: E501
# The file it reads, as a spreadsheet writes it: user 000123, reminded at 09:00 in Paris.
REMINDERS = [["user_id", "topic", "payload", "local_time", "zone"],
             ["000123", "remind.email", '{"user": 0, "text": "é✓ rappel, \\"quoted\\""}',
              "2026-11-24 09:00", "Europe/Paris"]]  # fmt: skip

RUN: dict[str, tuple[str, ...]] = {
    "docs/quick-start.md": ORDERS,
    "docs/sending.md": ONE_ID + SENDS,
    "docs/recurring.md": SERIES,
    "docs/http-api.md": (EXPORT, *CURLS),
    "docs/callers.md": (KEYS_NEW,),
    "docs/SIGNING.md": (KEYS_NEW, PUBLIC_HALF, OPENSSL_SIGN),
    "docs/spark.md": (SPARK_SHOW,),
}
_NAME = "a command's name in prose, not a command line to run"
_BENCHMARK = ("a benchmark: minutes of load on a stack of its own, measuring, not a check "
              "(benchmarks/ runs them)")  # fmt: skip
_FORM = "an option's form in prose (FILE and ID stand for the caller's own), not a command line"
_MAKE_RUN = ("installs system packages as root, then runs the local stack in the foreground on "
             "the page's fixed ports until Ctrl-C: tests/deploy/test_makefile.py runs its "
             "recipes (stand-ins for what they install), test_devstack.py the `blackbox dev` it "
             "starts")  # fmt: skip
_DEV = ("starts the local stack in the foreground until Ctrl-C, on the page's fixed ports "
        "(Redis 6379, Kafka 9092, the API 8080) and in the user's state folder")  # fmt: skip
_SPARK = ("a Spark job, a JVM session of its own (this file runs one printed Spark command: "
          "--show's)")  # fmt: skip
_SPEED = ("a figure of the page's speed table: a million rows, measured by hand, not a check "
          "(test_spark_input.py runs `spark schedule` on CSV files)")  # fmt: skip
SKIPPED: dict[str, dict[str, str]] = {
    "docs/quick-start.md": {
        "make run": _MAKE_RUN,
        "make test": "the whole suite, this file included: CI runs it",
        "BLACKBOX_POLICY_FILE=policy.yaml make run": "`make run` (as above) with the user's "
        "own policy file",
        "make run REDIS_PORT=6380 KAFKA_PORT=9093": "`make run` on other fixed ports: "
        "test_makefile.py::test_make_run_passes_the_ports_and_keeps_the_data_in_the_clone runs "
        "it (REDIS_PORT=6390 KAFKA_PORT=9190, stand-ins for what it installs)",
        "kcat -b 127.0.0.1:9092 -C -t orders -o beginning -e -f 'headers: %h\\nvalue: %s\\n'": (
            "test_examples.py::test_printed_read_back_shows_the_sent_message[docs/quick-start.md]"
            " runs it as printed (the broker and topic its own) once the send above is due, and "
            "checks it prints the message byte for byte"
        ),
        "blackbox dev --fresh": f"{_DEV}, which --fresh deletes: no test runs --fresh "
        "(test_devstack.py runs `blackbox dev` on free ports, a state folder of its own)",
        "blackbox dev --broker tansu": f"{_DEV}: "
        "test_devstack.py::test_dev_serves_its_open_api_to_this_machine_alone runs it on free "
        "ports",
        "blackbox dev --no-service": f"{_DEV}: "
        "test_devstack.py::test_dev_without_the_service_starts_only_redis_and_kafka runs it on "
        "free ports, a state folder of its own",
    },
    "docs/sending.md": {
        '--8<-- "examples/kcat/send.sh"': "includes examples/kcat/send.sh, which "
        "test_examples.py::test_kcat_example_delivers runs",
        "mvn dependency:copy-dependencies -DoutputDirectory=lib": "the Java example's build "
        "(a Maven download): test_examples.py::test_java_example_delivers_signed runs it, "
        "the plugin's version pinned",
        "java -cp 'lib/*' SendLater.java TOPIC": "the Java example, signed by the caller's "
        "own key: test_examples.py::test_java_example_delivers_signed runs it",
        "go run . TOPIC": "the Go example, signed by the caller's own key (a module "
        "download): test_examples.py::test_go_example_delivers_signed builds and runs it",
    },
    "docs/callers.md": {
        "python -m benchmarks.quotas --count 30000 --rounds 4": _BENCHMARK,
        "python -m benchmarks.signing --count 50000 --rounds 2": _BENCHMARK,
        "blackbox spark schedule": _NAME,
        "blackbox keys new": _NAME,
    },
    "docs/retries.md": {"python -m benchmarks.retries": _BENCHMARK},
    "docs/SIGNING.md": {"blackbox send --signing-key FILE --key-id ID": _FORM},
    "docs/spark.md": {
        "pip install 'blackbox[spark]'": "installs from a package index into the user's "
        "Python: `make setup` puts the extra's packages in .venv (the dev extra pins the same), "
        "where test_spark.py runs",
        "python -m blackbox.spark.example --rows 100000 --out users.parquet": f"{_SPARK}: "
        "test_spark.py builds the same dataset with example.dataset (20,000 rows) in its session",
        "blackbox spark schedule users.parquet --caller gdpr --id user_id --topic-column topic "
        "--message payload --due delay_s --due-as delay --jitter 60 --rejects rejects/": (
            f"{_SPARK}: test_spark.py::"
            "test_bulk_schedule_is_delivered_once_and_the_audit_agrees_with_the_service runs "
            "this job on that dataset (20,000 rows, --jitter 1 so as not to wait a minute)"
        ),
        SHOWN: "what the command above it prints, shown in its block: "
        "test_spark_pages_show_prints_the_record_the_page_shows checks that it prints exactly "
        "this",
        "blackbox spark audit --out audit/ --since 2026-11-24T00:00:00Z --max-late 5": (
            f"{_SPARK}: test_spark.py's audit tests run `spark audit --out DIR --since T` "
            "(with --margin 0; none gives --max-late)"
        ),
        "spark-submit --master spark://spark-master:7077 --packages "
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \"$(python -c 'import "
        "blackbox.spark.submit as s; print(s.__file__)')\" schedule s3a://bucket/users/*.parquet "
        "--caller gdpr --id user_id --topic-column topic --message payload --due delay_s "
        "--due-as delay --rejects s3a://bucket/rejects/": "needs the user's Spark cluster "
        "(spark://spark-master:7077) and S3 bucket",
        "blackbox spark ...": _NAME,
        "blackbox spark schedule": _NAME,
        "blackbox spark audit": _NAME,
        "python -m benchmarks.spark schedule --rows 1000000": _BENCHMARK,
        "python -m benchmarks.spark audit --rows 1000000": _BENCHMARK,
        "python -m benchmarks.spark scenario --rows 100000": _BENCHMARK,
        "python -m blackbox.spark.example --rows 1000000 --format csv --out rows.csv": _SPEED,
        "blackbox spark schedule rows.csv --format csv --caller c --id user_id --topic-column "
        "topic --message payload --due delay_s --due-as delay --master 'local[2]' --dry-run "
        "--rejects rejects/": _SPEED,
    },
}

SH_BLOCK = re.compile(r"^( *)```sh\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
ANY_BLOCK = re.compile(r"^( *)```.*?^\1```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`]+)`")
PROGRAMS = ("blackbox", ".venv/bin/blackbox", "curl", "kcat", "python", "java", "mvn", "go",
            "make", "pip", "openssl", "spark-submit")  # fmt: skip


def printed_commands(page: str) -> list[str]:
    """Every command `page` prints: its `sh` blocks' lines, then its inline commands."""
    text = (ROOT / page).read_text()
    blocks = [_shell_lines(body) for _, body in SH_BLOCK.findall(text)]
    return [line for lines in blocks for line in lines] + _inline(ANY_BLOCK.sub("", text))


def _shell_lines(body: str) -> list[str]:
    """A block's commands: continuations joined, each without its comment, none empty."""
    joined = re.sub(r"[ \t]*\\\n[ \t]*", " ", body)
    return [c for line in joined.splitlines() if (c := _uncommented(line.strip()))]


def _uncommented(line: str) -> str:
    """A shell line without its comment (a `#` starting a word, outside quotes)."""
    quote = ""
    for at, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (at == 0 or line[at - 1].isspace()):
            return line[:at].rstrip()
    return line


def _inline(prose: str) -> list[str]:
    """The code spans of `prose` that start with a program and have two words after it
    (a span broken over lines reads, as rendered, with one space)."""
    spans = (" ".join(span.split()) for span in SPAN.findall(prose))
    return [s for s in spans if s.split()[0] in PROGRAMS and len(s.split()) >= 3]


@pytest.mark.parametrize("page", PAGES)
def test_every_printed_command_is_run_or_skipped(page: str) -> None:
    """Each command a guide page prints is run by a test below or skipped with a reason,
    and each one named here is still printed: a new or changed command fails until it is
    run (or its skip explained)."""
    printed = printed_commands(page)
    named = set(RUN.get(page, ())) | set(SKIPPED.get(page, {}))
    assert [c for c in printed if c not in named] == [], "printed, neither run nor skipped"
    assert sorted(named - set(printed)) == [], "run or skipped, but no longer printed"
    assert not set(RUN.get(page, ())) & set(SKIPPED.get(page, {}))


@dataclass
class Shell:
    """A user's shell in the clone: runs a command `page` prints, as printed, but for the
    printed addresses and topics (`swaps`), which become the test's own; after `prelude`,
    a command the page prints before it, in the same shell (as the page's block pasted
    whole runs it)."""

    page: str
    env: dict[str, str]
    swaps: dict[str, str]
    prelude: str = ""
    ran: set[str] = field(default_factory=set)

    def __call__(
        self, command: str, *, cwd: Path = ROOT, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """The command's exit code and standard output, run in `cwd` with `env` added (its
        standard error, the logs, is shown when the test fails)."""
        commands = [c for c in (self.prelude, command) if c]
        printed = printed_commands(self.page)
        assert set(commands) <= set(printed), f"{self.page} no longer prints {commands}"
        self.ran.update(commands)
        assert (BIN / "blackbox").exists(), f"{BIN / 'blackbox'} is missing: make setup makes it"
        path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
        script = _here("\n".join(commands), self.swaps)
        done = subprocess.run(["/bin/sh", "-c", script], cwd=cwd,
                              env={**os.environ, **self.env, **(env or {}), "PATH": path},
                              capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
        print(f"$ {command}\n{done.stderr}")  # noqa: T201 - for a failure's report
        return done.returncode, done.stdout


def _here(command: str, swaps: dict[str, str]) -> str:
    """`command` with each printed address or topic (a whole word) replaced by ours."""
    for printed, own in swaps.items():
        command = re.sub(rf"(?<![\w.-]){re.escape(printed)}(?![\w.-])", own, command)
    return command


ShellFactory = Callable[..., tuple[Shell, httpx.Client]]


@pytest.fixture
def shell_of(env: dict[str, str]) -> Iterator[ShellFactory]:
    """`shell_of(page, service, *topics, token="")`: a shell reaching `service` (its API
    at BLACKBOX_API_URL, its broker and intake topic in the environment, `token` as TOKEN),
    each printed topic one of the test's own; and an API client of the test's own."""
    clients: list[httpx.Client] = []

    def make(
        page: str, service: Service, *topics: str, token: str = ""
    ) -> tuple[Shell, httpx.Client]:
        assert service.endpoints is not None
        port = service.endpoints.port
        api = f"http://127.0.0.1:{port}"
        addresses = {"127.0.0.1:9092": env["KAFKA_BOOTSTRAP_SERVERS"],
                     "127.0.0.1:8080": f"127.0.0.1:{port}",
                     "localhost:8080": f"localhost:{port}"}  # fmt: skip
        shell = Shell(page, {**env, "BLACKBOX_API_URL": api, "TOKEN": token},
                      addresses | {t: unique(t) for t in topics})  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        clients.append(httpx.Client(base_url=api + "/api/v1", headers=headers, timeout=15))
        return shell, clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def dev_open(start_service: ServiceFactory) -> Service:
    """A service as `make run` serves it: its API open to this machine, no token."""
    return start_service(BLACKBOX_API_DEV_OPEN="true")


def _stored(api: httpx.Client, blackbox_id: str) -> dict[str, Any]:
    """The schedule the API holds under `blackbox_id`, once the intake has stored it."""
    wait_until(lambda: api.get(f"/schedules/{blackbox_id}").status_code == 200, 30, blackbox_id)
    detail: dict[str, Any] = api.get(f"/schedules/{blackbox_id}").json()
    return detail


def _headers(detail: dict[str, Any]) -> dict[str, str | None]:
    return {h["name"]: h["value"] for h in detail["headers"]}


def _cells(line: str) -> list[str]:
    """A row of `blackbox list`'s table (columns apart by two spaces or more)."""
    return re.split(r"\s{2,}", line.strip())


def test_sending_pages_id_is_shown_moved_listed_and_cancelled(
    dev_open: Service, shell_of: ShellFactory
) -> None:
    """docs/sending.md's commands about one id: `list` says nothing pending; a cancel
    before the send finds nothing (not_found, exit 3); the send stores the message due in
    an hour, for billing; `show` prints it; `reschedule` answers updated and moves it 600 s
    out; `list` prints its header and the id's row, due as RFC 3339 UTC; the cancel
    answers cancelled (exit 0), and `show` then exits 3."""
    shell, api = shell_of("docs/sending.md", dev_open, "invoices")
    assert shell(LIST) == (0, NOTHING + "\n")
    assert shell(CANCEL) == (3, "not_found\n")
    sent_ms = now_ms()
    assert shell(SEND) == (0, "")
    _stored(api, "@billing/invoice-42")
    code, output = shell(SHOW)
    assert code == 0, output
    shown = orjson.loads(output)
    assert orjson.loads(shown["value"]) == {"invoice": 42}
    assert shown["item"]["caller"] == "billing"
    assert shown["item"]["topic"] == shell.swaps["invoices"]
    assert sent_ms + 3_600_000 <= shown["item"]["due_ms"] <= now_ms() + 3_600_000
    _moved_and_listed(shell, api)
    assert shell(CANCEL) == (0, "cancelled\n")
    assert shell(SHOW) == (3, "")
    assert shell.ran == set(ONE_ID)


def _moved_and_listed(shell: Shell, api: httpx.Client) -> None:
    asked_ms = now_ms()
    assert shell(RESCHEDULE) == (0, "updated\n")
    due_ms = api.get("/schedules/@billing/invoice-42").json()["item"]["due_ms"]
    assert asked_ms + 600_000 <= due_ms <= now_ms() + 600_000
    code, output = shell(LIST)
    assert code == 0, output
    header, *rows = output.splitlines()
    assert _cells(header) == list(SCHEDULE_COLUMNS)
    row = [utc_text(due_ms), "@billing/invoice-42", shell.swaps["invoices"], '{"invoice":42}']
    assert [_cells(r) for r in rows] == [row], output


def test_sending_pages_sends_are_stored_as_sent_and_delivered(
    dev_open: Service, shell_of: ShellFactory, reader: ReaderFactory, tmp_path: Path
) -> None:
    """docs/sending.md's sends each exit 0 and store what they say: `--at` due at that
    instant with its key, header and text; `--binary` the file's bytes; `--file` each
    line's envelope as billing's; `--wait` prints scheduled, then updated. Moved to now
    through the API, each is delivered as sent."""
    shell, api = shell_of("docs/sending.md", dev_open, "invoices", "files")
    lines = unique("lines")
    _users_files(tmp_path, lines)
    assert shell(SEND_FILE, cwd=tmp_path) == (0, "")
    delivered = reader(lines).wait_count(3)
    assert sorted(orjson.loads(r.value or b"")["line"] for r in delivered) == [0, 1, 2]
    assert {r.header("CALLER_SERVICE") for r in delivered} == {"billing"}
    assert shell(SEND_WAIT) == (0, "scheduled\n")
    assert shell(SEND_WAIT) == (0, "updated\n")
    assert shell(SEND_AT) == (0, "")
    assert shell(SEND_BINARY, cwd=tmp_path) == (0, "")
    at, binary = (
        _one_stored(api, shell.swaps["invoices"], "hello"),
        _one_stored(api, shell.swaps["files"], None),
    )
    assert at["item"]["due_ms"] == 1_893_456_000_000
    assert (at["item"]["key"], _headers(at)["trace"]) == ("42", "abc")
    assert base64.b64decode(binary["value_base64"]) == bytes(range(256))
    _moved_to_now(api, "@billing/inv-7", at["item"]["blackbox_id"], binary["item"]["blackbox_id"])
    _delivered_as_sent(reader, shell.swaps)
    assert shell.ran == set(SENDS)


def _users_files(folder: Path, topic: str) -> None:
    """The files the page's sends name: report.pdf (every byte value) and schedules.jsonl
    (three envelopes for `topic`, due now)."""
    (folder / "report.pdf").write_bytes(bytes(range(256)))
    envelopes = ({"topic": topic, "message": {"line": n}, "countdown": 0, "id": f"line-{n}"}
                 for n in range(3))  # fmt: skip
    (folder / "schedules.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in envelopes))


def _moved_to_now(api: httpx.Client, *blackbox_ids: str) -> None:
    """Rescheduled through the API to fire now (the sends are due in 60 s or in 2030)."""
    for blackbox_id in blackbox_ids:
        moved = api.post(f"/schedules/{blackbox_id}/reschedule", json={"countdown": 0})
        assert moved.json()["outcome"] == "updated", moved.text


def _one_stored(api: httpx.Client, topic: str, value: str | None) -> dict[str, Any]:
    """The one schedule for `topic` sent without an id (its id derived from its intake
    record), in whole."""

    def unnamed() -> list[str]:
        page = api.get("/schedules", params={"topic": topic}).json()
        return [item["blackbox_id"] for item in page["items"] if item["id"] is None]

    wait_until(lambda: len(unnamed()) == 1, 30, f"a schedule without an id for {topic}")
    detail = _stored(api, unnamed()[0])
    assert detail["value"] == value
    return detail


def _delivered_as_sent(reader: ReaderFactory, topics: dict[str, str]) -> None:
    invoices = reader(topics["invoices"]).wait_count(2)
    by_value = {r.value: r for r in invoices}
    assert set(by_value) == {b"hello", b'{"n":7}'}
    hello, seven = by_value[b"hello"], by_value[b'{"n":7}']
    assert (hello.key, hello.header("trace")) == (b"42", "abc")
    assert seven.header("CALLER_SERVICE") == "billing"
    (report,) = reader(topics["files"]).wait_count(1)
    assert report.value == bytes(range(256))


def test_recurring_pages_series_is_sent_paused_listed_and_resumed(
    dev_open: Service, shell_of: ShellFactory
) -> None:
    """docs/recurring.md's shell commands: the series send exits 0 and stores billing's
    series of "run"; pause answers paused; `list --series` prints its header and the
    series' row (its next run at 09:00 Berlin time with Berlin's offset, its rule, zone,
    runs fired, limit and state paused); resume answers resumed."""
    shell, api = shell_of("docs/recurring.md", dev_open, "reports")
    assert shell(SERIES_SEND) == (0, "")
    stored = _stored(api, "@billing/daily")
    assert (stored["value"], stored["item"]["topic"]) == ("run", shell.swaps["reports"])
    assert shell(PAUSE) == (0, "paused\n")
    code, output = shell(LIST_SERIES)
    assert code == 0, output
    header, row = output.splitlines()
    assert _cells(header) == list(SERIES_COLUMNS)
    upcoming, *rest = _cells(row)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT09:00:00\+0[12]:00", upcoming), output
    assert rest == ["@billing/daily", "cron '0 9 * * 1-5'", "Europe/Berlin", "0", "none",
                    "paused"]  # fmt: skip
    assert shell(RESUME) == (0, "resumed\n")
    assert api.get("/schedules/@billing/daily").json()["item"]["series"]["paused"] is False
    assert shell.ran == set(SERIES)


def _json(shell: Shell, command: str, env: dict[str, str] | None = None) -> Any:
    """What a printed `curl` prints: the API's JSON answer (curl exits 0 on any status)."""
    code, output = shell(command, env=env)
    assert code == 0, output
    return orjson.loads(output)


@pytest.mark.parametrize("stack", ["make run", "token"])
def test_http_api_pages_curls_answer_as_the_page_says(
    start_service: ServiceFactory, shell_of: ShellFactory, stack: str
) -> None:
    """docs/http-api.md's curl commands, on `make run`'s stack (no token: each after the
    page's `export TOKEN=...` as printed) and on one with a token (the service's as
    TOKEN): the create answers the id it will have, and stores it; the listing gives 20 of
    billing's 21 schedules and a cursor, which gives the last; get shows the message;
    reschedule answers updated 600 s out; stats counts the 21 pending; delete answers
    cancelled."""
    if stack == "token":
        service = start_service(BLACKBOX_API_TOKEN=TOKEN)
        shell, api = shell_of("docs/http-api.md", service, "invoices", token=TOKEN)
    else:
        service = start_service(BLACKBOX_API_DEV_OPEN="true")
        shell, api = shell_of("docs/http-api.md", service, "invoices")
        shell.prelude = EXPORT
    _twenty_of_billings(api, shell.swaps["invoices"])
    created = _json(shell, CURL_CREATE)
    assert created["blackbox_id"] == "@billing/invoice-42", created
    wait_until(lambda: api.get("/stats").json()["pending"] == 21, 30, "21 pending")
    first = _json(shell, CURL_LIST)
    assert (len(first["items"]), first["cursor"] is not None) == (20, True), first
    last = _json(shell, CURL_NEXT, {"CURSOR": first["cursor"]})
    assert (len(last["items"]), last["cursor"]) == (1, None), last
    ids = {i["blackbox_id"] for i in first["items"] + last["items"]}
    assert ids == {"@billing/invoice-42"} | {f"@billing/p-{n}" for n in range(20)}
    _got_moved_counted_and_cancelled(shell, api)
    assert shell.ran == set(CURLS) | ({EXPORT} if shell.prelude else set())


def _twenty_of_billings(api: httpx.Client, topic: str) -> None:
    """Twenty schedules of billing's, due in an hour: the page's listing of 20 has a next."""
    for n in range(20):
        envelope = {"topic": topic, "message": n, "countdown": 3600, "id": f"p-{n}"}
        assert api.post("/schedules", json={"caller": "billing", "envelope": envelope}).is_success


def _got_moved_counted_and_cancelled(shell: Shell, api: httpx.Client) -> None:
    got = _json(shell, CURL_GET)
    assert orjson.loads(got["value"]) == {"n": 42}, got
    assert got["item"]["topic"] == shell.swaps["invoices"], got
    asked_ms = now_ms()
    moved = _json(shell, CURL_RESCHEDULE)
    assert moved["outcome"] == "updated", moved
    assert asked_ms + 600_000 <= moved["due_ms"] <= now_ms() + 600_000
    assert _json(shell, CURL_STATS)["pending"] == 21
    assert _json(shell, CURL_DELETE)["outcome"] == "cancelled"
    assert api.get("/schedules/@billing/invoice-42").status_code == 404


def test_callers_pages_key_command_writes_a_key_and_prints_its_entry(tmp_path: Path) -> None:
    """docs/callers.md's `blackbox keys new`: it writes the private key to billing.pem and
    prints the policy entry listing its public half under the key id."""
    shell = Shell("docs/callers.md", {}, {})
    code, output = shell(KEYS_NEW, cwd=tmp_path)
    assert code == 0, output
    key = load_pem_private_key((tmp_path / "billing.pem").read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    assert f'  billing-2026-11: "{public_text(key.public_key())}"' in output.splitlines(), output
    assert shell.ran == {KEYS_NEW}


def test_quick_start_pages_orders_are_delivered_cancelled_and_tombstoned(
    env: dict[str, str],
    start_service: ServiceFactory,
    shell_of: ShellFactory,
    reader: ReaderFactory,
) -> None:
    """docs/quick-start.md's commands, on a stack as `make run` starts it (its API open, its
    intake topic of DEV_PARTITIONS partitions): order 1's send exits 0 and `{"order":1}` is
    on orders, billing's, five seconds later; order 7, due in 600 s, is cancelled
    (`cancelled`, exit 0) and order 8 is not found (`not_found`, exit 3); order 7 sent again
    is cancelled by kcat's tombstone, which sits on its key's murmur2 partition."""
    intake = env["BLACKBOX_INTAKE_TOPIC"]
    clients.ensure_topics({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}, [intake],
                          partitions=DEV_PARTITIONS)  # fmt: skip
    service = start_service(BLACKBOX_API_DEV_OPEN="true")
    shell, api = shell_of("docs/quick-start.md", service, "orders")
    sent_ms = now_ms()
    assert shell(ORDER) == (0, "")
    assert shell(ORDER_7) == (0, "")
    assert _stored(api, "@billing/order-7")["item"]["due_ms"] >= sent_ms + 600_000
    assert shell(CANCEL_7) == (0, "cancelled\n")
    assert shell(CANCEL_8) == (3, "not_found\n")
    _tombstoned(shell, api, reader(intake), intake)
    (order,) = reader(shell.swaps["orders"]).wait_count(1)
    assert (order.value, order.header("CALLER_SERVICE")) == (b'{"order":1}', "billing")
    assert order.created_ms >= sent_ms + 5_000
    assert shell.ran == set(ORDERS)


def _tombstoned(shell: Shell, api: httpx.Client, intake: TopicReader, topic: str) -> None:
    """Order 7 sent again, then cancelled by the page's kcat tombstone (to the intake topic,
    `topic` here): every order-7 record sits on the key's murmur2 partition."""
    assert shell(ORDER_7) == (0, "")
    _stored(api, "@billing/order-7")
    assert replace(shell, swaps=shell.swaps | {"blackbox": topic})(TOMBSTONE) == (0, "")
    gone = "order 7 cancelled by the tombstone"
    wait_until(lambda: api.get("/schedules/@billing/order-7").status_code == 404, 30, gone)
    read = intake.wait_for(lambda rs: any(r.key == b"order-7" and r.value is None for r in rs))
    partitions = {r.partition for r in read if r.key == b"order-7"}
    assert partitions == {clients.java_partition(b"order-7", DEV_PARTITIONS)}


def _fenced(page: str, kind: str) -> str:
    """The text of the first block of `kind` (its fence's word) that `page` prints."""
    found = re.search(rf"^```{kind}\n(.*?)^```", (ROOT / page).read_text(), re.M | re.S)
    assert found is not None, f"{page} prints no {kind} block"
    return found.group(1)


def _public_half(shell: Shell, folder: Path) -> str:
    """The public key `openssl pkey -pubout` prints for folder's billing.pem, as a policy
    lists it."""
    code, pem = shell(PUBLIC_HALF, cwd=folder)
    assert code == 0, pem
    public = load_pem_public_key(pem.encode())
    assert isinstance(public, Ed25519PublicKey), pem
    return public_text(public)


def test_signing_pages_openssl_prints_the_public_half_and_the_examples_signature(
    tmp_path: Path,
) -> None:
    """docs/SIGNING.md's commands: `blackbox keys new` writes billing.pem and prints the
    entry of the public half `openssl pkey` then prints; with the worked example's key as
    billing.pem and its signed bytes as signed.txt, openssl prints the public half the
    page's policy lists and, signing, the very signature of the page's header."""
    page, made, example = "docs/SIGNING.md", tmp_path / "made", tmp_path / "example"
    made.mkdir()
    example.mkdir()
    shell = Shell(page, {}, {})
    code, entry = shell(KEYS_NEW, cwd=made)
    assert code == 0, entry
    assert f'  billing-2026-11: "{_public_half(shell, made)}"' in entry.splitlines(), entry
    seed = bytes.fromhex(_fenced(page, "seed").strip())
    (example / "billing.pem").write_bytes(private_pem(Ed25519PrivateKey.from_private_bytes(seed)))
    (example / "signed.txt").write_bytes(_fenced(page, "signed").encode())
    assert f'billing-2026-11: "{_public_half(shell, example)}"' in _fenced(page, "yaml")
    signature = _fenced(page, "header").split()[-1]
    assert shell(OPENSSL_SIGN, cwd=example) == (0, signature)
    assert shell.ran == set(RUN[page])


def test_spark_pages_show_prints_the_record_the_page_shows(
    env: dict[str, str], tmp_path: Path
) -> None:
    """docs/spark.md's `--dry-run --show 1`, on a reminders.csv as a spreadsheet writes it
    (user 000123, reminded at 09:00 Paris time, the message holding quotes and non-ASCII
    text), exits 0 and prints the intake record the page shows under it, byte for byte (the
    intake topic the test's own). The one printed Spark command run here: a JVM session."""
    intake = env["BLACKBOX_INTAKE_TOPIC"]
    clients.ensure_topics({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]},
                          [intake, env["BLACKBOX_EVENTS_TOPIC"]])  # fmt: skip
    with (tmp_path / "reminders.csv").open("w", newline="", encoding="utf-8") as out:
        csv.writer(out).writerows(REMINDERS)
    shell = Shell("docs/spark.md", env, {})
    code, output = shell(SPARK_SHOW, cwd=tmp_path)
    assert code == 0, output
    shown = [line for line in output.splitlines() if line.startswith('{"topic"')]
    assert shown == [_here(SHOWN, {"blackbox": intake})], output
    assert shell.ran == {SPARK_SHOW}

"""The command line's API commands (list, show, reschedule) and `send --wait`."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from blackbox.clock import now_ms
from blackbox.exits import EXIT_FAILED, EXIT_UNCHANGED
from blackbox.schedule import Schedule
from tests.integration.conftest import ServiceFactory, cli_of
from tests.integration.test_api import TOKEN, fill
from tests.process import BlackboxProcess


def test_list_show_and_reschedule_speak_to_the_api(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """`blackbox list`, `show` and `reschedule` reach the API with the token from the
    environment and print what it answers; a missing id exits 3 (EXIT_UNCHANGED), as
    `cancel`, `pause` and `resume` do, and a refusal (a wrong token) exits 1."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    assert service.endpoints is not None
    cli_env = {**env, "BLACKBOX_API_TOKEN": TOKEN,
               "BLACKBOX_API_URL": f"http://127.0.0.1:{service.endpoints.port}"}  # fmt: skip
    fill(service, [Schedule("@ops/a", "t", b"hello", now_ms() + 600_000, caller=b"ops")])

    def run(name: str, *args: str) -> tuple[int, str]:
        process = BlackboxProcess(cli_env, tmp_path / f"{name}.log", *args)
        return process.wait(), process.output()

    code, listed = run("list", "list", "--caller", "ops")
    assert code == 0 and "@ops/a" in listed and "hello" in listed
    code, shown = run("show", "show", "@ops/a")
    assert code == 0 and '"value": "hello"' in shown
    code, moved = run("move", "reschedule", "@ops/a", "--countdown", "300")
    assert code == 0 and "updated" in moved.splitlines()
    code, missing = run("missing", "show", "@ops/none")
    assert code == EXIT_UNCHANGED == 3 and "not_found" in missing
    code, missing = run("missing-move", "reschedule", "@ops/none", "--countdown", "300")
    assert code == EXIT_UNCHANGED and "not_found" in missing.splitlines()
    code, missing = run("missing-move-other", "reschedule", "plain-id", "--countdown", "300")
    assert code == EXIT_UNCHANGED and "not_found" in missing.splitlines()
    wrong_token = {**cli_env, "BLACKBOX_API_TOKEN": "x" * 32}
    refused = BlackboxProcess(wrong_token, tmp_path / "refused.log", "reschedule", "@ops/a",
                              "--countdown", "9")  # fmt: skip
    assert refused.wait() == EXIT_FAILED and "unauthorized" in refused.output()


def test_send_wait_prints_the_answer_and_fails_on_a_dead_letter(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """`send --wait` prints `scheduled`, and exits 1 naming the reason when blackbox
    dead-letters the request (here: a topic of blackbox's own)."""
    start_service()

    def send(name: str, topic: str) -> tuple[int, str]:
        process = BlackboxProcess(env, tmp_path / f"{name}.log", "send", "--topic", topic,
                                  "--countdown", "600", "--id", name, "--caller", "cli",
                                  "--wait", "30", '"x"')  # fmt: skip
        return process.wait(60), process.output()

    code, output = send("fine", "somewhere")
    assert code == 0 and "scheduled" in output.splitlines(), output
    code, output = send("refused", env["BLACKBOX_EVENTS_TOPIC"])
    assert code == 1 and "dead_lettered" in output.splitlines(), output
    assert "forbidden_topic" in output


def test_list_names_its_columns_shows_rfc3339_due_times_and_says_when_nothing_is_pending(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """`blackbox list` prints `nothing pending` for an empty listing; otherwise a header
    naming each column, then each schedule with its due time as RFC 3339 UTC (as `list
    --series` prints its times), not as epoch milliseconds."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    run = cli_of(service, env, TOKEN, tmp_path)

    assert run("empty", "list") == (0, "nothing pending\n")
    assert run("empty-series", "list", "--series") == (0, "nothing pending\n")
    due = now_ms() + 600_123
    fill(service, [Schedule("@ops/a", "orders", b"hello there", due, caller=b"ops")])
    code, listed = run("list", "list")
    assert code == 0
    header, row = listed.splitlines()
    assert re.split(r"\s{2,}", header) == ["DUE (UTC)", "ID", "TOPIC", "MESSAGE (START)"]
    assert [row.index(c) for c in ("@ops/a", "orders", "hello")] == [
        header.index(c) for c in ("ID", "TOPIC", "MESSAGE")
    ]
    when, blackbox_id, topic, preview = row.split(maxsplit=3)
    assert (blackbox_id, topic, preview) == ("@ops/a", "orders", "hello there")
    assert when.endswith("Z") and datetime.fromisoformat(when).timestamp() * 1000 == due

"""The operator's commands that speak to the HTTP API: `blackbox list` (`--series`), `show`,
`reschedule`.

The API's address is --api (default BLACKBOX_API_URL, else http://127.0.0.1:8080); the
token is BLACKBOX_API_TOKEN, sent as a bearer token.
"""

from __future__ import annotations

import argparse
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

from blackbox.cli.listing import page_lines
from blackbox.cli.sending import error, exit_for
from blackbox.exits import EXIT_FAILED, EXIT_OK, EXIT_UNCHANGED
from blackbox.kafka.events import Outcome
from blackbox.settings import Settings
from blackbox.storage.connections import mask_url

TIMEOUT_SECONDS = 15.0


def add_commands(commands: Any) -> None:
    api = os.environ.get("BLACKBOX_API_URL", "http://127.0.0.1:8080")
    listing = commands.add_parser("list", help="list pending schedules (through the API)")
    listing.add_argument("--caller", help="only this caller's schedules")
    listing.add_argument("--topic", help="only schedules delivering to this topic")
    listing.add_argument("--cursor", help="the `next` of the previous page: the page after it")
    listing.add_argument("--limit", type=int, default=50, help="most schedules on a page")
    listing.add_argument("--series", action="store_true",
                         help="list series (recurring schedules) and their next run")  # fmt: skip
    listing.set_defaults(command=cmd_list, api=api)
    show = commands.add_parser("show", help="show one pending schedule (through the API)")
    show.add_argument("id", metavar="ID", help="its blackbox_id, e.g. @billing/invoice-42")
    show.set_defaults(command=cmd_show, api=api)
    move = commands.add_parser("reschedule", help="move a pending schedule (through the API)")
    move.add_argument("id", metavar="ID", help="its blackbox_id")
    when = move.add_mutually_exclusive_group(required=True)
    when.add_argument("--countdown", type=float, help="seconds from now")
    when.add_argument("--at", help="RFC 3339 with an offset, or epoch seconds")
    move.set_defaults(command=cmd_reschedule, api=api)
    for parser in (listing, show, move):
        parser.add_argument("--api", default=api, help=f"the API's address (default {api})")


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    query = {k: v for k in ("caller", "topic", "cursor") if (v := getattr(args, k)) is not None}
    query["limit"] = str(args.limit)
    path = "/series?" if args.series else "/schedules?"
    status, page = _call(args.api, settings, "GET", path + urllib.parse.urlencode(query))
    if status != 200:
        return _failed(page)
    for line in page_lines(page["items"], series=args.series, more=bool(page["cursor"])):
        print(line)  # noqa: T201 - the command's output
    if page["cursor"]:
        print(f"more: --cursor {page['cursor']}")  # noqa: T201
    return EXIT_OK


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    status, found = _call(args.api, settings, "GET", "/schedules/" + _quoted(args.id))
    if status != 200:
        return _failed(found)
    print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())  # noqa: T201
    return EXIT_OK


def cmd_reschedule(args: argparse.Namespace, settings: Settings) -> int:
    if args.countdown is not None:
        body: dict[str, Any] = {"countdown": args.countdown}
    else:
        body = {"deliver_at": float(args.at) if _number(args.at) else args.at}
    path = f"/schedules/{_quoted(args.id)}/reschedule"
    _status, answer = _call(args.api, settings, "POST", path, body)
    # A 404 before any schedule was looked at (an id no token of this caller may hold) is
    # the same answer as one looked for: not_found.
    outcome = answer.get("outcome") or _not_found(answer)
    if outcome is None:  # refused: a token, a bad time, dead-lettered
        return _failed(answer)
    print(outcome)  # noqa: T201 - the command's output
    if outcome != Outcome.UPDATED.value:
        error(f"{outcome}: nothing was changed")
    return exit_for(outcome, frozenset({Outcome.UPDATED.value}))


def _call(
    api: str, settings: Settings, method: str, path: str, body: object = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if settings.api_token:
        headers["Authorization"] = f"Bearer {settings.api_token}"
    data = None if body is None else orjson.dumps(body)
    url = api.rstrip("/") + "/api/v1" + path
    if not url.startswith(("http://", "https://")):
        shown = mask_url(api)
        return 0, {"error": "bad_address", "reason": f"--api {shown!r} is not an http(s) URL"}
    request = urllib.request.Request(url, data, headers, method=method)  # noqa: S310 - checked
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read() or b"{}")
    except urllib.error.URLError as e:
        return 0, {"error": "unreachable", "reason": f"{mask_url(api)}: {e.reason}"}


def _quoted(blackbox_id: str) -> str:
    return urllib.parse.quote(blackbox_id, safe="@/:")


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _not_found(answer: dict[str, Any]) -> str | None:
    found = answer.get("error") == Outcome.NOT_FOUND.value
    return Outcome.NOT_FOUND.value if found else None


def _failed(answer: dict[str, Any]) -> int:
    """Say why the API refused; exit as `cancel` does: EXIT_UNCHANGED for an id it does not
    hold (not_found), EXIT_FAILED for any other refusal."""
    error(f"{answer.get('error')}: {answer.get('reason')}")
    return EXIT_UNCHANGED if _not_found(answer) else EXIT_FAILED

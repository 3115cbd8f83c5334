"""The API's pure parts: who may call what, and the listing cursor."""

from __future__ import annotations

import base64

import orjson
import pytest
from fastapi.security import HTTPAuthorizationCredentials

from blackbox.api.access import Access
from blackbox.api.cursors import KEY_BYTES, Cursors, Position
from blackbox.api.errors import ApiError
from blackbox.api.views import preview
from blackbox.errors import BadCursor

TOKEN = "unit-token-0123456789"  # noqa: S105 - a test token


def bearer(token: str) -> HTTPAuthorizationCredentials:
    return HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)


def status(access: Access, credentials: HTTPAuthorizationCredentials | None, *, read: bool) -> int:
    try:
        access.check(credentials, read=read)
    except ApiError as e:
        return e.status
    return 200


def test_a_token_guards_reads_and_writes() -> None:
    """With a token, a call without it or with another is 401, with it 200; open reads
    need none."""
    access = Access(TOKEN, reads_open=False, dev_open=False)
    assert status(access, None, read=True) == 401
    assert status(access, bearer("wrong"), read=False) == 401
    assert status(access, bearer(TOKEN), read=False) == 200
    assert status(Access(TOKEN, reads_open=True, dev_open=False), None, read=True) == 200
    assert status(Access(TOKEN, reads_open=True, dev_open=False), None, read=False) == 401


def test_without_a_token_only_local_development_opens_the_api() -> None:
    """No token configured: refused 403, unless the local-development setting is on; the
    dev setting never bypasses a token that is set."""
    assert status(Access("", reads_open=False, dev_open=False), None, read=False) == 403
    assert status(Access("", reads_open=False, dev_open=True), None, read=False) == 200
    assert status(Access(TOKEN, reads_open=False, dev_open=True), None, read=False) == 401


def test_the_token_is_masked_in_repr() -> None:
    """repr(Access) never shows the token."""
    assert TOKEN not in repr(Access(TOKEN, reads_open=False, dev_open=False))


def test_a_cursor_round_trips_names_nothing_and_a_forged_one_is_refused() -> None:
    """Guarantee 7: a cursor opens to the position it seals and shows nothing of it (not
    the id, not in base64); a cursor in the clear (as handed out before), altered, junk or
    sealed under another key raises BadCursor."""
    cursors = Cursors(lambda: b"k" * KEY_BYTES)
    position = Position(1_763_790_000_000, "@billing/invoice-42")
    sealed = cursors.seal(position)
    assert cursors.open(sealed) == position
    clear = base64.urlsafe_b64encode(orjson.dumps([position.score, position.id])).decode()
    assert "billing" not in sealed and clear.rstrip("=")[4:20] not in sealed
    assert sealed != cursors.seal(position)  # a nonce of its own each time
    altered = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    other = Cursors(lambda: b"o" * KEY_BYTES).seal(position)
    for forged in ("", "!!!", "WzEsMl0", "eyJhIjogMX0", clear, altered, other):
        with pytest.raises(BadCursor):
            cursors.open(forged)


def test_a_preview_is_short_text_and_binary_shows_its_size() -> None:
    """Previews keep the first 80 characters of text; binary shows as its size."""
    assert preview(b"x" * 500) == "x" * 80
    assert preview("é".encode() * 100) == "é" * 80
    assert preview(b"\xff\xfe\x00") == "<3 bytes binary>"


def test_a_write_is_authorised_from_the_authorization_header_alone() -> None:
    """check_write reads the raw header as HTTPBearer does (scheme in any case), before any
    body: the token passes, anything else is 401, no token configured is 403 (guarantee 4)."""
    access = Access(TOKEN, reads_open=True, dev_open=False)
    assert write_status(access, f"Bearer {TOKEN}") == 200
    assert write_status(access, f"bearer {TOKEN}") == 200
    for header in (None, "", "Bearer", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN):
        assert write_status(access, header) == 401, header
    assert write_status(Access("", reads_open=True, dev_open=False), None) == 403
    assert write_status(Access("", reads_open=False, dev_open=True), None) == 200


def test_the_api_is_open_when_some_call_needs_no_token() -> None:
    """Open reads, or local development without a token, make the API open (and so guarded
    by Host); with a token and closed reads it is not, dev setting or not."""
    assert Access(TOKEN, reads_open=True, dev_open=False).open
    assert Access("", reads_open=False, dev_open=True).open
    assert not Access(TOKEN, reads_open=False, dev_open=True).open
    assert not Access("", reads_open=False, dev_open=False).open


def write_status(access: Access, header: str | None) -> int:
    try:
        access.check_write(header)
    except ApiError as e:
        return e.status
    return 200

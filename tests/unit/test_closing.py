"""The bound on a request head (closing.py): which answer a head over MAX_HEAD_BYTES gets."""

from __future__ import annotations

import orjson

from blackbox.api.closing import MAX_HEAD_BYTES, head_refusal


def _status_and_error(answer: bytes | None) -> tuple[str, str] | None:
    if answer is None:
        return None
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head and b"content-length: %d" % len(body) in head
    return head.split(b"\r\n")[0].decode(), orjson.loads(body)["error"]


def test_a_head_within_the_bound_passes_whole_or_in_part() -> None:
    """A head of MAX_HEAD_BYTES (its blank line included), or part of one, is let through."""
    line = b"GET /" + b"a" * (MAX_HEAD_BYTES - 100) + b" HTTP/1.1\r\n"
    head = line + b"Host: x\r\n" + b"X: " + b"b" * (MAX_HEAD_BYTES - len(line) - 16) + b"\r\n\r\n"
    assert len(head) == MAX_HEAD_BYTES
    assert head_refusal(head) is None
    assert head_refusal(head + b"a body of any length" * 10_000) is None
    assert head_refusal(line) is None


def test_a_long_request_line_is_414_and_long_headers_431() -> None:
    """A request line over the bound (ended or not) is 414; a short line whose headers take
    the head over it is 431, whether the head has ended or is still coming."""
    long_line = b"GET /?" + b"q" * MAX_HEAD_BYTES
    assert _status_and_error(head_refusal(long_line)) == ("HTTP/1.1 414 URI Too Long",
                                                          "uri_too_long")  # fmt: skip
    ended = _status_and_error(head_refusal(long_line + b" HTTP/1.1\r\n\r\n"))
    assert ended is not None and ended[1] == "uri_too_long"
    headers = b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEAD_BYTES // 6)
    expected = ("HTTP/1.1 431 Request Header Fields Too Large", "headers_too_large")
    assert _status_and_error(head_refusal(headers)) == expected
    assert _status_and_error(head_refusal(headers + b"\r\n")) == expected
    bare = b"GET / HTTP/1.1\n" + b"X: y\n" * (MAX_HEAD_BYTES // 5)  # lone LFs end lines too
    assert _status_and_error(head_refusal(bare)) == expected

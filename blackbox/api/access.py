"""Access: who may call what on the API, from the bearer token of each call (tokens.py
holds what each token may do)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from fastapi.security import HTTPAuthorizationCredentials
from fastapi.security.utils import get_authorization_scheme_param

from blackbox.api.errors import ApiError
from blackbox.api.tokens import DEV_OPEN, OPEN_READS, OPERATOR, Grant, Tokens


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call what: the bearer token, whether reads need it, the local-dev bypass, and
    the Host names answered besides the local ones while some call needs no token."""

    token: str  # the operator's: every caller, reads and writes
    reads_open: bool
    dev_open: bool
    hosts: tuple[str, ...] = ()
    tokens: Tokens = field(default_factory=lambda: Tokens({}))  # acting for some callers

    def __repr__(self) -> str:
        return f"Access(token={'********' if self.token else ''!r}, reads_open={self.reads_open})"

    @property
    def open(self) -> bool:
        """Whether some call needs no token (then only the Host names served are answered)."""
        return self.reads_open or (self.dev_open and not self.token and not self.tokens)

    def check(self, credentials: HTTPAuthorizationCredentials | None, *, read: bool) -> Grant:
        """What the call's token may do; ApiError when it may not make this call."""
        given = "" if credentials is None else credentials.credentials
        if read and self.reads_open and not given:
            return OPEN_READS
        if not self.token and not self.tokens:
            if self.dev_open:
                return DEV_OPEN
            raise ApiError(403, "disabled", "set BLACKBOX_API_TOKEN to use this endpoint")
        grant = self._grant(given)
        if grant is None:
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
        if not (grant.read if read else grant.write):
            raise ApiError(403, "forbidden", f"token {grant.name!r} may not "
                           f"{'read' if read else 'change'} schedules")  # fmt: skip
        return grant

    def _grant(self, given: str) -> Grant | None:
        if self.token and hmac.compare_digest(given.encode(), self.token.encode()):
            return OPERATOR
        return self.tokens.grant_for(given)

    def check_write(self, authorization: str | None) -> None:
        """`check` for a call that changes something, from its Authorization header alone."""
        scheme, given = get_authorization_scheme_param(authorization)
        bearer = scheme.lower() == "bearer" and bool(given)
        credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=given)
        self.check(credentials if bearer else None, read=False)

"""API tokens: what each bearer token may do, and for which callers.

`BLACKBOX_API_TOKEN` is the operator's token: every caller, reads and writes. A file named
by `BLACKBOX_API_TOKENS_FILE` (YAML or JSON, mounted from a Secret) adds tokens that act
for some callers only, stored as SHA-256 hashes so the file never holds a usable token:

    tokens:
      - name: billing-service                 # shown in logs, never the token
        sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        callers: [billing]                    # ["*"]: every caller (another operator)
        scopes: [read, write]                 # read: list and get; write: create, cancel,
                                              # reschedule

A token acting for some callers sees, creates, cancels and reschedules only their ids;
totals across callers (stats, dead letters, lateness) need a token for every caller.
`echo -n "$TOKEN" | sha256sum` gives a token's hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from blackbox.errors import SettingsError

ALL = "*"
_SCOPES = frozenset({"read", "write"})
_FIELDS = frozenset({"name", "sha256", "callers", "scopes"})


@dataclass(frozen=True, slots=True)
class Grant:
    """What one token may do: for `callers` (None: every caller), reads and/or writes."""

    name: str
    callers: frozenset[str] | None
    read: bool
    write: bool

    def acts_for(self, caller: str | None) -> bool:
        """Whether it may act for `caller` (None: schedules sent without CALLER_SERVICE,
        which only a token for every caller reaches)."""
        return self.callers is None or (caller is not None and caller in self.callers)

    @property
    def sole_caller(self) -> str | None:
        """Its one caller, when it acts for exactly one."""
        if self.callers is not None and len(self.callers) == 1:
            return next(iter(self.callers))
        return None


OPERATOR = Grant("operator", None, read=True, write=True)
OPEN_READS = Grant("open reads", None, read=True, write=False)
DEV_OPEN = Grant("dev open", None, read=True, write=True)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Tokens:
    """Grants by the SHA-256 of their token."""

    by_digest: Mapping[str, Grant]

    def grant_for(self, token: str) -> Grant | None:
        return self.by_digest.get(digest(token)) if token else None

    def __bool__(self) -> bool:
        return bool(self.by_digest)

    def __repr__(self) -> str:  # the names only: a hash is as good as its token offline
        return f"Tokens({sorted(grant.name for grant in self.by_digest.values())})"


def tokens_of(operator_token: str, path: str) -> Tokens:
    """The operator's token and the file's, by digest; SettingsError names a bad entry."""
    grants = {digest(operator_token): OPERATOR} if operator_token else {}
    if path:
        grants |= _load(path)
    return Tokens(grants)


def _load(path: str) -> dict[str, Grant]:
    try:
        text = Path(path).read_text("utf-8")
        document = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        # Not chained: YAML's message quotes the lines around the fault, token hashes among
        # them, and a chained cause is printed with any traceback.
        reason = _unreadable(e)
        raise SettingsError(f"BLACKBOX_API_TOKENS_FILE {path!r} cannot be read: {reason}") from None
    entries = document.get("tokens") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise SettingsError(f"{path}: expected a mapping with a list 'tokens'")
    grants: dict[str, Grant] = {}
    for index, entry in enumerate(entries):
        hashed, grant = _grant(entry, f"{path}: tokens[{index}]")
        if hashed in grants:
            raise SettingsError(f"{path}: tokens[{index}] repeats another token")
        grants[hashed] = grant
    return grants


def _unreadable(error: Exception) -> str:
    """Why the file could not be read, with where, but never a quote of its text."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"invalid YAML: {error.problem}{where}"
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    if isinstance(error, yaml.YAMLError | UnicodeDecodeError):
        return f"invalid {'YAML' if isinstance(error, yaml.YAMLError) else 'UTF-8'}"
    return str(error)  # json.JSONDecodeError: what and where, no text


def _grant(entry: object, where: str) -> tuple[str, Grant]:
    if (
        not isinstance(entry, dict)
        or set(entry) - _FIELDS
        or not {"sha256", "callers"} <= set(entry)
    ):
        raise SettingsError(f"{where} needs sha256 and callers (and may have name, scopes)")
    hashed = entry["sha256"]
    if not isinstance(hashed, str) or len(hashed) != 64 or not _is_hex(hashed):
        raise SettingsError(f"{where}.sha256 must be 64 hex digits (sha256sum of the token)")
    callers = entry["callers"]
    if not isinstance(callers, list) or not callers or not all(isinstance(c, str) and c
                                                               for c in callers):  # fmt: skip
        raise SettingsError(f'{where}.callers must be a list of caller names, or ["*"]')
    scopes = entry.get("scopes", ["read", "write"])
    if not isinstance(scopes, list) or not scopes or set(scopes) - _SCOPES:
        raise SettingsError(f"{where}.scopes must list read and/or write")
    name = str(entry.get("name", hashed[:8]))
    who = None if ALL in callers else frozenset(callers)
    return hashed.lower(), Grant(name, who, "read" in scopes, "write" in scopes)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)

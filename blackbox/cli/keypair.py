"""The `blackbox keys` command and the signing options of `send` and `cancel`.

`blackbox keys new --key-id ID` writes a new Ed25519 private key (PKCS#8 PEM, readable by
its owner only) for a caller to sign with, and prints the policy entry that lists its
public key. The private key never reaches blackbox.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from blackbox.errors import SettingsError
from blackbox.exits import EXIT_OK
from blackbox.settings import Settings
from blackbox.signing import Signer, new_key_pair


def add_signing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--signing-key", type=Path, metavar="FILE",
                        help="sign the request with this Ed25519 private key (PEM)")  # fmt: skip
    parser.add_argument("--key-id", help="the id the policy lists the key's public half under")


def signer_of(args: argparse.Namespace) -> Signer | None:
    """The signer the options name, or None; SettingsError when they are incomplete."""
    if args.signing_key is None and args.key_id is None:
        return None
    if args.signing_key is None or args.key_id is None:
        raise SettingsError("--signing-key and --key-id go together")
    if args.caller is None:
        raise SettingsError("a signed request needs --caller")
    try:
        return Signer.from_pem(args.signing_key.read_bytes(), args.key_id)
    except (OSError, ValueError) as e:
        raise SettingsError(f"--signing-key {args.signing_key}: {e}") from e


def add_commands(commands: Any) -> None:
    keys = commands.add_parser("keys", help="make signing keys for callers")
    verbs = keys.add_subparsers(dest="verb", required=True)
    new = verbs.add_parser("new", help="write a new Ed25519 key pair; print its policy entry")
    new.add_argument("--key-id", required=True, help="its id in the policy (say billing-2026-11)")
    new.add_argument("--out", type=Path, required=True, metavar="FILE",
                     help="where to write the private key (must not exist)")  # fmt: skip
    new.set_defaults(command=cmd_keys_new)


def cmd_keys_new(args: argparse.Namespace, _settings: Settings) -> int:
    pem, public = new_key_pair()
    try:
        Signer.from_pem(pem, args.key_id)  # the id is valid
    except ValueError as e:
        raise SettingsError(f"--key-id: {e}") from e
    try:
        descriptor = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise SettingsError(f"--out {args.out}: {e.strerror}") from e
    with os.fdopen(descriptor, "wb") as out:
        out.write(pem)
    print(f"private key written to {args.out} (keep it with the caller)")  # noqa: T201
    print("policy entry (under callers.<name>.keys):")  # noqa: T201
    print(f'  {args.key_id}: "{public}"')  # noqa: T201
    return EXIT_OK

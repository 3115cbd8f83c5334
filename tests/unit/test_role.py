"""Roles: `blackbox run --role` and what each role runs."""

from __future__ import annotations

import pytest

from blackbox.cli import main as cli
from blackbox.role import Role


def _role(*argv: str) -> Role:
    return Role(cli._parser().parse_args(["run", *argv]).role)


def test_run_takes_a_role_and_defaults_to_all() -> None:
    """`blackbox run` runs every part; `--role intake|dispatch|all` names one."""
    assert _role() is Role.ALL
    assert [_role("--role", r) for r in ("intake", "dispatch", "all")] == list(
        (Role.INTAKE, Role.DISPATCH, Role.ALL)
    )


def test_an_unknown_role_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`--role` outside the three exits with code 2 and names the choices."""
    with pytest.raises(SystemExit) as exited:
        _role("--role", "firing")
    assert exited.value.code == 2
    assert "choose from 'all', 'intake', 'dispatch'" in capsys.readouterr().err


def test_intake_never_fires_and_dispatch_never_takes_intake() -> None:
    """Each role runs its part only; `all` runs both."""
    parts = {role: (role.takes_intake, role.fires) for role in Role}
    assert parts == {
        Role.ALL: (True, True),
        Role.INTAKE: (True, False),
        Role.DISPATCH: (False, True),
    }

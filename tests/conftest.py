"""What every test shares."""

from __future__ import annotations

import pytest

from blackbox import logs


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cli.main` run in the test process must not configure structlog for the rest of the
    session: its loggers, cached on first use, would bypass `capture_logs()` in later tests."""
    monkeypatch.setattr(logs, "configure", lambda *_args, **_kwargs: None)

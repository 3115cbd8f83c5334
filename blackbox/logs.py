"""structlog configuration: JSON lines in production, readable console output on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}  # fmt: skip


def configure(log_format: str = "auto", level: str = "info") -> None:
    """Route blackbox's events (and the libraries' warnings) to stderr in one format."""
    console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s"
    )
    # A drain longer than the poll interval makes APScheduler skip ticks: expected, not news.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)

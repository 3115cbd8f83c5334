"""blackbox: a durable delayed-message service for Apache Kafka, backed by Redis."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """`blackbox.__version__`: the installed release (blackbox.version), read when asked."""
    if name == "__version__":
        from blackbox.version import version  # noqa: PLC0415 - read only when asked

        return version()
    raise AttributeError(f"module 'blackbox' has no attribute {name!r}")

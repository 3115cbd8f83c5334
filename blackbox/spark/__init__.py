"""The data pipeline on Spark: bulk scheduling (`schedule`) and the delivery audit (`audit`).

PySpark is an optional extra (`pip install 'blackbox[spark]'`): the service and its image do
not carry it. The jobs import the service's own envelope, policy, key and schedule code, so a
row is judged exactly as the intake would judge the record it becomes.
"""

from __future__ import annotations

from blackbox.errors import SparkMissing

INSTALL_HINT = "pip install 'blackbox[spark]'"


def require() -> None:
    """Raise SparkMissing, saying how to install it, when PySpark is not importable."""
    try:
        import matplotlib  # noqa: F401, PLC0415
        import pyspark  # noqa: F401, PLC0415
    except ImportError as e:
        raise SparkMissing(f"the Spark jobs need PySpark and matplotlib: {INSTALL_HINT}") from e

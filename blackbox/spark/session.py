"""The Spark session of a job: `local[*]` with Spark's Kafka connector by default, or the
session `spark-submit` made (on a cluster the connector comes from `--packages`).

The connector is `org.apache.spark:spark-sql-kafka-0-10_2.13` at PySpark's own version,
fetched once from Maven Central by `blackbox.dev.maven` into the user's cache. Only the jars
PySpark does not ship already are handed over (`spark.jars`): the token provider,
`kafka-clients` and `commons-pool2`; the rest (Scala, Hadoop's client) would be second copies.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from blackbox.dev import maven

CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"
DEFAULT_MASTER = "local[*]"
# Set by spark-submit for the Python driver it starts: the JVM exists already.
_SUBMITTED = "PYSPARK_GATEWAY_PORT"
_VERSIONED_JAR = re.compile(r"(?P<artifact>.+?)-\d[\w.]*\.jar")


def connector_coordinates(version: str = pyspark.__version__) -> str:
    """The Maven coordinates `--packages` takes on a cluster."""
    return f"{CONNECTOR}:{version}"


def connector_jars(root: Path | None = None) -> list[Path]:
    """The connector's jars that PySpark lacks, fetched with Maven on first use."""
    folder = maven.classpath("spark-kafka", [connector_coordinates()], root)
    shipped = {_artifact(jar.name) for jar in (Path(pyspark.__file__).parent / "jars").iterdir()}
    return sorted(jar for jar in folder.glob("*.jar") if _artifact(jar.name) not in shipped)


def _artifact(jar_name: str) -> str:
    """`kafka-clients-3.9.2.jar` -> `kafka-clients`."""
    match = _VERSIONED_JAR.fullmatch(jar_name)
    return match["artifact"] if match else jar_name


def submitted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether spark-submit started this driver (its master and packages then apply)."""
    return _SUBMITTED in environ


def start(master: str | None = None, app: str = "blackbox", ui: bool = False) -> SparkSession:
    """The job's session; an existing one (a test's, spark-submit's) is reused."""
    # Before the JVM starts: executors must run this interpreter (with blackbox installed),
    # and a machine whose host name does not resolve must still reach its own driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    # Every encoding Java knows for `--encoding` (Spark 4 allows only UTF and ISO-8859-1
    # otherwise): spreadsheets export windows-1252, Shift_JIS, ...
    builder = builder.config("spark.sql.legacy.javaCharsets", "true")
    builder = builder.config("spark.ui.showConsoleProgress", str(ui).lower())
    if not submitted():
        builder = builder.master(master or DEFAULT_MASTER)
        builder = builder.config("spark.jars", ",".join(str(j) for j in connector_jars()))
        builder = builder.config("spark.ui.enabled", "false")
        builder = builder.config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

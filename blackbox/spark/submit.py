"""The application file for `spark-submit`: `blackbox spark` with the same arguments.

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        .../blackbox/spark/submit.py schedule data/ --caller gdpr ...
"""

from __future__ import annotations

import sys

from blackbox.cli import main as cli

if __name__ == "__main__":
    sys.exit(cli.main(["spark", *sys.argv[1:]]))

"""The `blackbox` command: running the service, sending and cancelling, the operator's
commands that call the HTTP API, and the Spark jobs."""

#!/bin/sh
# Order 42 fails the first time: the worker hands it to blackbox, which delivers it again
# 1 s later (then 5 s, 30 s, then checkout.dlq). Run in the clone after `make run`; prints
# the worker's two lines: failed, then ok.
set -e
echo 'order-42:{"order": 42}' | kcat -P -b "${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:9092}" \
  -t checkout -K: -H 'trace=checkout-7'
.venv/bin/python examples/python/retry_consumer.py checkout 8

#!/bin/sh
# A reminder in 30 minutes: {"user": 42, ...} delivered to the topic reminders, keyed 42.
# Run in the clone after `make run`; prints blackbox's answer: scheduled.
set -e
.venv/bin/blackbox send --topic reminders --caller shop --id cart-42 --key 42 \
  --countdown 1800 --wait 10 '{"user": 42, "text": "Your cart is waiting"}'
.venv/bin/blackbox show @shop/cart-42

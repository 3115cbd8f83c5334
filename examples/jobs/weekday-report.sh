#!/bin/sh
# A report at 09:00 every weekday, Berlin time (summer time included).
# Prints blackbox's answer (scheduled), then the series and its next run in Berlin time.
set -e
.venv/bin/blackbox send --topic reports --caller shop --id weekday-report \
  --cron "0 9 * * 1-5" --timezone Europe/Berlin --wait 10 '{"report": "sales"}'
.venv/bin/blackbox list --series --caller shop

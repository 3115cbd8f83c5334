#!/bin/sh
# Cancel the reminder before it fires, by the id it was sent with. Run in the clone.
# Prints blackbox's answer: cancelled (exit 3 with not_found or already_fired).
set -e
.venv/bin/blackbox cancel cart-42 --caller shop --wait 10

#!/bin/sh
# Schedule a message with kcat: delivered to $1 in 2 seconds.
#   KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 sh send.sh TOPIC
set -eu
topic=$1
echo "invoice-44|{\"topic\": \"$topic\", \"message\": {\"invoice\": 44}, \"countdown\": 2, \"id\": \"invoice-44\"}" |
  kcat -b "${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:9092}" -P -t "${BLACKBOX_INTAKE_TOPIC:-blackbox}" \
    -K '|' -H CALLER_SERVICE=billing \
    -X partitioner=murmur2_random -X enable.idempotence=true

"""The local stack for development and tests: redis-server and an Apache Kafka broker on
loopback, with the jars fetched from Maven Central."""

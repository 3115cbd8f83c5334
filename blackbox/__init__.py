"""blackbox: a durable delayed-message service for Apache Kafka, backed by Redis."""

__version__ = "0.1.0"

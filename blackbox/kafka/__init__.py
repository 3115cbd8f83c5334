"""Kafka: client settings, the outbox every write goes through, dead letters, answer
events, and reading answers back."""

"""Intake: records read from the intake topics, checked against the callers' policy and their
identity, stored in Redis or dead-lettered, and answered."""

"""The outbox relay: creation's job changes, delivered to notify at least once."""

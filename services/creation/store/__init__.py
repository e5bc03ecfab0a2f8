"""creation's SQL: the statements on creation's tables and the functions that run them."""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = [
    "admin",
    "admin_reads",
    "backlog",
    "catalog",
    "deletions",
    "fenced",
    "jobs",
    "leases",
    "ledger",
    "ledger_entries",
    "outbox",
    "output_purges",
    "remote",
    "submit_statement",
    "webhook_deliveries",
    "webhooks",
]

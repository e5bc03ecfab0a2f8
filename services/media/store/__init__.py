"""media's store: the only place with its SQL. ``assets`` owns the assets table."""

__all__ = ["assets"]

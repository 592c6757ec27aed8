"""How the ledger writes many rows at once: rows made by the database from other rows, fresh planner statistics after a bulk change, and the item tallies on SQLite."""

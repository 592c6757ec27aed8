"""How the ledger writes many rows at once: rows made by the database from other rows (`setwise`),
fresh planner statistics after a bulk change (`table_statistics`), and the item and draft tallies on SQLite
(`tallies`); and a JSON column that keeps what it is given as written (`json_as_written`)."""

"""`make bench` (SPEC §10, issue 9): a fresh PostgreSQL database, a generated catalogue, and every
figure measured against a baseline taken in the same run, so the ratios hold on any machine.

- `run.py` puts it together and prints the table; `database.py` makes and drops the database;
  `catalogue_file.py` writes the catalogue; `measuring.py` times a command in its own process.
- One module per figure (`importing.py`, `job_creation.py`): `measure(bench) -> list[Figure]`;
  `batchwizard.py` runs batchwizard 0.5 beside the collection (`collection.py`).
  A figure not written yet is listed in `run.NOT_MEASURED_YET`, printed as such, never guessed.
"""

"""The import's ceiling: the very rows an import of new products wrote (products and their first
revisions), loaded again by PostgreSQL's `COPY` into tables like the ledger's own, with their
indexes (the trigram ones of the catalogue's search included) but no triggers and no Python work
(nothing read, checked or hashed). No import writing those rows can be faster. Measured beside the
COPY baseline, it shows how much of the baseline's speed the ledger's tables leave to an import.

Run in processes of their own, like the figures:
`python -m ledger.bench.copy_ledger export DATABASE_URL FOLDER` writes the rows to files (not
timed); `... load DATABASE_URL FOLDER` makes the tables and loads them in one transaction and
prints the rows and the seconds the load took once connected (the import's figure is timed the
same way: Python's start and the connection, which an idle Django process times, counted out);
`... drop DATABASE_URL` drops the tables again."""

import sys
import time
from pathlib import Path

import psycopg

# (the ledger's table, its copy) in the order they are loaded.
TABLES = (("ledger_sourcerevision", "bench_ceiling_revision"), ("ledger_product", "bench_ceiling_product"))
BLOCK_BYTES = 1024 * 1024


def export(database_url: str, folder: Path) -> None:
    with psycopg.connect(database_url) as connection, connection.cursor() as cursor:
        for table, _ in TABLES:
            with (
                (folder / f"{table}.copy").open("wb") as sink,
                cursor.copy(f"COPY {table} TO STDOUT") as copy,
            ):
                for block in copy:
                    sink.write(block)


def load(database_url: str, folder: Path) -> tuple[int, float]:
    """Loads the files `export` wrote; returns the products loaded and the seconds from the
    connection to the commit."""
    with psycopg.connect(database_url) as connection:
        started = time.perf_counter()
        loaded = load_tables(connection, folder)
        connection.commit()
        return loaded, time.perf_counter() - started


def load_tables(connection: psycopg.Connection, folder: Path) -> int:
    with connection.cursor() as cursor:
        for table, ceiling in TABLES:
            cursor.execute(f"DROP TABLE IF EXISTS {ceiling}")
            cursor.execute(f"CREATE TABLE {ceiling} (LIKE {table} INCLUDING ALL)")
            with (
                (folder / f"{table}.copy").open("rb") as source,
                cursor.copy(f"COPY {ceiling} FROM STDIN") as copy,
            ):
                while block := source.read(BLOCK_BYTES):
                    copy.write(block)
        return cursor.rowcount


def drop(database_url: str) -> None:
    with psycopg.connect(database_url) as connection:
        for _, ceiling in TABLES:
            connection.execute(f"DROP TABLE IF EXISTS {ceiling}")


if __name__ == "__main__":
    step, url, *rest = sys.argv[1:]
    if step == "export":
        export(url, Path(rest[0]))
    elif step == "load":
        loaded, seconds = load(url, Path(rest[0]))
        print(loaded, f"{seconds:.6f}")
    else:
        drop(url)

"""The import's baseline: PostgreSQL's `COPY` of the same catalogue lines into a plain staging table,
each line a `jsonb` document (PostgreSQL parses it; Python only streams bytes). Run in a process of
its own, like the figures: `python -m ledger.bench.copy_rows DATABASE_URL PATH`."""

import sys

import psycopg


def copy_rows(database_url: str, path: str) -> int:
    with psycopg.connect(database_url) as connection:
        connection.execute("DROP TABLE IF EXISTS bench_staging")
        connection.execute("CREATE TABLE bench_staging (line integer NOT NULL, document jsonb NOT NULL)")
        rows = 0
        with (
            open(path, encoding="utf-8") as lines,
            connection.cursor() as cursor,
            cursor.copy("COPY bench_staging (line, document) FROM STDIN") as copy,
        ):
            for rows, line in enumerate(lines, start=1):
                copy.write_row((rows, line.rstrip("\n")))
    return rows


if __name__ == "__main__":
    print(copy_rows(sys.argv[1], sys.argv[2]))

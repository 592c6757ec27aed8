"""PostgreSQL plans every query from statistics about each table, which autovacuum keeps up to date:
when it runs. It may be switched off on a server (it is on this project's machines), and when it is
on it wakes once a minute. A table a bulk change has just filled has no statistics, and the planner
then guesses: the catalogue search by title took 234 ms instead of 31 at 1.2 million products,
reading revisions in order instead of through their trigram index.

So a bulk change (an import, a job's items) analyses each table it changed a lot, by autovacuum's own
rule: more rows changed than 50 + 10 % of the table. ANALYZE reads a sample of 30,000 rows, well
under a second at a million, and takes no lock that stops readers or writers. And where autovacuum is
off, the collector's round does once a minute what its analyses would have done for the ledger's
tables (`analyse_stale_tables`), for the changes that come a few at a time (results, reviews)."""

from django.apps import apps
from django.db import connection, models

# autovacuum_analyze_threshold and autovacuum_analyze_scale_factor's defaults.
THRESHOLD_ROWS = 50
SCALE_FACTOR = 0.1


def needs_analysis(changed: int, rows_known: float) -> bool:
    """Whether `changed` rows make a table's statistics stale, for a table the statistics put at
    `rows_known` rows (below 0: never analysed)."""
    if rows_known < 0:
        return changed > 0
    return changed > THRESHOLD_ROWS + SCALE_FACTOR * rows_known


def analyse_after_bulk_change(changed: dict[type[models.Model], int]) -> list[str]:
    """ANALYZE each model's table whose `changed` rows pass the rule; returns the tables analysed.
    Called after the change is committed (inside a transaction, ANALYZE would not see its rows). The
    demo's SQLite plans without such statistics."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return []
    tables = {model._meta.db_table: rows for model, rows in changed.items() if rows}
    if not tables:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r'",
            [list(tables)],
        )
        stale = [name for name, rows_known in cursor.fetchall() if needs_analysis(tables[name], rows_known)]
        for name in sorted(stale):
            cursor.execute(f'ANALYZE "{name}"')
    return sorted(stale)


def analyse_stale_tables() -> list[str]:
    """On a server where autovacuum is off, ANALYZE each of the ledger's tables changed by more than
    the rule since it was last analysed (PostgreSQL counts the changes); returns those analysed.
    Where autovacuum is on, it does this itself."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return []
    tables = [model._meta.db_table for model in apps.get_app_config("ledger").get_models()]
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum') = 'on'")
        if cursor.fetchone()[0]:
            return []
        cursor.execute(
            """
            SELECT s.relname, s.n_mod_since_analyze, c.reltuples
            FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
            WHERE s.relname = ANY(%s)
            """,
            [tables],
        )
        stale = sorted(
            name for name, changed, rows_known in cursor.fetchall() if needs_analysis(changed, rows_known)
        )
        for name in stale:
            cursor.execute(f'ANALYZE "{name}"')
    return stale

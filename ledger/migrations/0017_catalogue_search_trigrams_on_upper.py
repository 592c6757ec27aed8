"""The catalogue search's trigram indexes on what Django's case-insensitive `icontains` compares on
PostgreSQL, `UPPER(column::text) LIKE UPPER(…)`: an index on the bare column (migration 0014) is
never used by it. SQLite, the demo's database, has none and searches by scanning."""

from django.db import migrations

SQL = """
DROP INDEX IF EXISTS product_sku_trgm;
DROP INDEX IF EXISTS revision_title_trgm;
CREATE INDEX product_sku_trgm ON ledger_product USING gin ((upper(sku::text)) gin_trgm_ops);
CREATE INDEX revision_title_trgm ON ledger_sourcerevision USING gin ((upper(title::text)) gin_trgm_ops);
"""
REVERSE_SQL = """
DROP INDEX IF EXISTS product_sku_trgm;
DROP INDEX IF EXISTS revision_title_trgm;
CREATE INDEX product_sku_trgm ON ledger_product USING gin (sku gin_trgm_ops);
CREATE INDEX revision_title_trgm ON ledger_sourcerevision USING gin (title gin_trgm_ops);
"""


def on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0016_item_tally_insert_counts_only")]

    operations = [migrations.RunPython(on_postgresql(SQL), on_postgresql(REVERSE_SQL))]

"""An import of new products writes an entry in every index of products and revisions, and then
analyses both tables: two index entries a product that nothing reads, and a column the analysis
samples for no query, are left out (PostgreSQL; SQLite, the demo's database, has neither):

- `ledger_product_sku_…_like`, the index Django adds beside a unique text column for `LIKE 'abc%'`
  (`sku__startswith`, case-sensitive): nothing asks for it. SKUs are found whole (`sku = …`,
  `sku IN (…)`, by `ledger_product_sku_key`), in order or between two SKUs (the same index), or by
  text they contain whatever the case (`UPPER(sku) LIKE …`, by the trigram index `product_sku_trgm`).
- `ledger_product.published_version_id`'s index holds only the products something was published for:
  it is read to find the products a generated version is published for (deleting a version,
  PROTECT), never for products without one, which every newly imported product is.
- `ledger_sourcerevision.fields` gets no statistics: no query filters or sorts revisions by their
  whole fields, and sampling 30,000 documents of them was a third of the import's analysis of
  revisions.
"""

from django.db import migrations

SQL = """
DROP INDEX IF EXISTS ledger_product_sku_14e222ed_like;
DROP INDEX IF EXISTS ledger_product_published_version_id_8dfaa55d;
CREATE INDEX ledger_product_published_version_id_8dfaa55d ON ledger_product (published_version_id)
    WHERE published_version_id IS NOT NULL;
ALTER TABLE ledger_sourcerevision ALTER COLUMN fields SET STATISTICS 0;
"""
REVERSE_SQL = """
CREATE INDEX IF NOT EXISTS ledger_product_sku_14e222ed_like ON ledger_product (sku varchar_pattern_ops);
DROP INDEX IF EXISTS ledger_product_published_version_id_8dfaa55d;
CREATE INDEX ledger_product_published_version_id_8dfaa55d ON ledger_product (published_version_id);
ALTER TABLE ledger_sourcerevision ALTER COLUMN fields SET STATISTICS -1;
"""


def on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0024_job_planning_claim")]

    operations = [migrations.RunPython(on_postgresql(SQL), on_postgresql(REVERSE_SQL))]

"""More columns no query filters, groups or sorts by are left out of the planner's statistics (as
migrations 0025 and 0048 did), on PostgreSQL. An import analyses the products and revisions it wrote
(`analyse_after_bulk_change`): for 50,000 new products that ANALYZE took about 170 ms of the import's
1.9 s, and these columns were 65 ms of it (a revision's 64-character hash is sorted like any text):

- a revision's `content_hash`: compared with a staged row's, joined by the revision's id, never looked
  up by itself;
- a product's `line_digest` (bytes) and `published_content` (the text last applied): read with their
  product, never searched.
"""

from django.db import migrations

COLUMNS = {
    "ledger_sourcerevision": ("content_hash",),
    "ledger_product": ("line_digest", "published_content"),
}


def statistics(target: int):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for table, columns in COLUMNS.items():
            for column in columns:
                schema_editor.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" SET STATISTICS {target}')

    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0051_event_references_probed_for_few_rows")]

    operations = [migrations.RunPython(statistics(0), statistics(-1))]

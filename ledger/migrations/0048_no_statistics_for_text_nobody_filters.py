"""Columns no query filters, groups or sorts by are left out of the planner's statistics (as
0025 did for revisions' fields), on PostgreSQL: every ANALYZE (a job's creation analyses its items'
events; autovacuum analyses the drafts as a unit's results arrive) samples 30,000 rows and sorts each
column's values, and the long texts and JSON documents of drafts and events were most of that work:

- a draft's `content`, `raw_output`, `usage`, `validation_notes` and `validation_reasons`: read with
  their draft, never searched (`content_hash` keeps its statistics);
- an event's `reason` and `data`: read with their item, filtered only among one item's events.
"""

from django.db import migrations

COLUMNS = {
    "ledger_generatedversion": ("content", "raw_output", "usage", "validation_notes", "validation_reasons"),
    "ledger_event": ("reason", "data"),
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
    dependencies = [("ledger", "0047_output_schema_as_written")]

    operations = [migrations.RunPython(statistics(0), statistics(-1))]

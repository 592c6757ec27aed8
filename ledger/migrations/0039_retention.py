"""Retention (SPEC §11): an unusable draft's text can be erased, keeping when and how long it was.

Erasing a draft's text changes none of what it counts for in the item tallies, but PostgreSQL's
statement-level trigger on updated drafts took every updated row back and counted it again (its
transition tables allow no column list): a retention pass of a million drafts would have done a
million drafts' tally work for nothing. It now counts only the drafts whose counted columns changed,
as SQLite's row trigger (ledger/database/tallies.py) already did with its WHEN."""

import importlib

from django.db import migrations, models

TALLIES = importlib.import_module("ledger.migrations.0013_item_tallies")

CHANGED_ONLY_SQL = f"""
CREATE OR REPLACE FUNCTION ledger_version_tally_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A draft's tokens changed (or it moved): what it counted for, taken back and counted again.
    WITH moved AS (
        SELECT o.id FROM old_versions o JOIN new_versions n ON n.id = o.id
        WHERE (o.item_id, o.number, o.input_tokens, o.output_tokens, o.usage)
              IS DISTINCT FROM (n.item_id, n.number, n.input_tokens, n.output_tokens, n.usage)
    ), changed AS (
        SELECT id, item_id, number, input_tokens, output_tokens, usage, -1 AS sign
        FROM old_versions WHERE id IN (SELECT id FROM moved)
        UNION ALL
        SELECT id, item_id, number, input_tokens, output_tokens, usage, 1
        FROM new_versions WHERE id IN (SELECT id FROM moved)
    )
    {TALLIES.VERSION_CONTRIBUTION_SQL}
    RETURN NULL;
END $$;
"""

EVERY_ROW_SQL = f"""
CREATE OR REPLACE FUNCTION ledger_version_tally_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH changed AS (
        SELECT id, item_id, number, input_tokens, output_tokens, usage, -1 AS sign FROM old_versions
        UNION ALL
        SELECT id, item_id, number, input_tokens, output_tokens, usage, 1 FROM new_versions
    )
    {TALLIES.VERSION_CONTRIBUTION_SQL}
    RETURN NULL;
END $$;
"""


def on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0038_pilot_drill"),
    ]

    operations = [
        migrations.AddField(
            model_name="generatedversion",
            name="content_expired_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="generatedversion",
            name="content_length",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(on_postgresql(CHANGED_ONLY_SQL), on_postgresql(EVERY_ROW_SQL)),
    ]

"""Item tallies: counts of a job's items by state, and its drafts' tokens, kept by triggers in the
same transaction as every change to `ledger_item` or `ledger_generatedversion` (see `ItemTally`),
backfilled here from the rows that exist. Also the indexes keyset pages read in order."""

import django.db.models.deletion
from django.db import migrations, models

# A draft of an item in these states waits for a decision (pricing.UNDECIDED_STATES), and an
# approved draft of an item in these may never be published (pricing.DISCARDED_STATES).
UNDECIDED = "('returned', 'awaiting_review')"
DISCARDED = "('obsolete', 'withdrawn', 'cancelled')"
COLUMNS = (
    "job_id, state, items, pending_input, pending_output, approved_drafts, approved_input, "
    "approved_output, all_input, all_output, apportioned_drafts"
)

# PostgreSQL: statement-level triggers read every changed row at once from the transition tables,
# so a set-wise statement of a million rows appends a few rows here, not a million.
ITEM_CONTRIBUTION_SQL = f"""
    INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT c.job_id, c.state, SUM(c.sign),
           COALESCE(SUM(c.sign * latest.input_tokens), 0), COALESCE(SUM(c.sign * latest.output_tokens), 0),
           COALESCE(SUM(c.sign) FILTER (WHERE approved.input_tokens IS NOT NULL), 0),
           COALESCE(SUM(c.sign * approved.input_tokens), 0), COALESCE(SUM(c.sign * approved.output_tokens), 0),
           0, 0, 0
    FROM changed c
    LEFT JOIN LATERAL (
        SELECT v.input_tokens, v.output_tokens FROM ledger_generatedversion v
        WHERE c.state IN {UNDECIDED} AND v.item_id = c.id ORDER BY v.number DESC LIMIT 1
    ) latest ON true
    LEFT JOIN LATERAL (
        SELECT v.input_tokens, v.output_tokens FROM ledger_generatedversion v
        WHERE c.approved_version_id IS NOT NULL AND c.state NOT IN {DISCARDED} AND v.id = c.approved_version_id
    ) approved ON true
    GROUP BY c.job_id, c.state;
"""

# What one draft counts for, under its item's state: every draft's tokens; the pending tokens when it
# is the latest draft of an item waiting for a decision; the approved tokens when it is the draft
# approved for an item that may still publish it.
VERSION_CONTRIBUTION_SQL = f"""
    INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, 0,
           COALESCE(SUM(c.sign * c.input_tokens) FILTER (WHERE pending), 0),
           COALESCE(SUM(c.sign * c.output_tokens) FILTER (WHERE pending), 0),
           0,
           COALESCE(SUM(c.sign * c.input_tokens) FILTER (WHERE approved), 0),
           COALESCE(SUM(c.sign * c.output_tokens) FILTER (WHERE approved), 0),
           SUM(c.sign * c.input_tokens), SUM(c.sign * c.output_tokens),
           COALESCE(SUM(c.sign) FILTER (WHERE c.usage -> 'apportioned' = 'true'::jsonb), 0)
    FROM changed c
    JOIN ledger_item i ON i.id = c.item_id
    CROSS JOIN LATERAL (
        SELECT i.state IN {UNDECIDED} AND NOT EXISTS (
                   SELECT 1 FROM ledger_generatedversion later
                   WHERE later.item_id = c.item_id AND later.number > c.number
               ) AS pending,
               i.approved_version_id = c.id AND i.state NOT IN {DISCARDED} AS approved
    ) counts
    GROUP BY i.job_id, i.state;
"""

POSTGRESQL_SQL = f"""
CREATE FUNCTION ledger_item_tally_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH changed AS (SELECT id, job_id, state, approved_version_id, 1 AS sign FROM new_items)
    {ITEM_CONTRIBUTION_SQL}
    RETURN NULL;
END $$;
CREATE FUNCTION ledger_item_tally_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        SELECT o.id, o.job_id AS old_job, o.state AS old_state, o.approved_version_id AS old_approved,
               n.job_id AS new_job, n.state AS new_state, n.approved_version_id AS new_approved
        FROM old_items o JOIN new_items n ON n.id = o.id
        WHERE (o.job_id, o.state, o.approved_version_id) IS DISTINCT FROM (n.job_id, n.state, n.approved_version_id)
    ), changed AS (
        SELECT id, old_job AS job_id, old_state AS state, old_approved AS approved_version_id, -1 AS sign FROM moved
        UNION ALL
        SELECT id, new_job, new_state, new_approved, 1 FROM moved
    )
    {ITEM_CONTRIBUTION_SQL}
    RETURN NULL;
END $$;
CREATE FUNCTION ledger_item_tally_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH changed AS (SELECT id, job_id, state, approved_version_id, -1 AS sign FROM old_items)
    {ITEM_CONTRIBUTION_SQL}
    RETURN NULL;
END $$;
CREATE FUNCTION ledger_version_tally_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A draft arriving for an item that already waits for a decision becomes its latest: the
    -- pending tokens change by its difference from the one before it.
    INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, 0,
           COALESCE(SUM(n.input_tokens - COALESCE(previous.input_tokens, 0)) FILTER (WHERE i.state IN {UNDECIDED}), 0),
           COALESCE(SUM(n.output_tokens - COALESCE(previous.output_tokens, 0)) FILTER (WHERE i.state IN {UNDECIDED}), 0),
           0, 0, 0,
           SUM(n.input_tokens), SUM(n.output_tokens),
           COUNT(*) FILTER (WHERE n.usage -> 'apportioned' = 'true'::jsonb)
    FROM new_versions n
    JOIN ledger_item i ON i.id = n.item_id
    LEFT JOIN LATERAL (
        SELECT p.input_tokens, p.output_tokens FROM ledger_generatedversion p
        WHERE i.state IN {UNDECIDED} AND p.item_id = n.item_id AND p.number < n.number
        ORDER BY p.number DESC LIMIT 1
    ) previous ON true
    GROUP BY i.job_id, i.state;
    RETURN NULL;
END $$;
CREATE FUNCTION ledger_version_tally_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A draft's tokens changed (or it was deleted): what it counted for, taken back and counted again.
    WITH changed AS (
        SELECT id, item_id, number, input_tokens, output_tokens, usage, -1 AS sign FROM old_versions
        UNION ALL
        SELECT id, item_id, number, input_tokens, output_tokens, usage, 1 FROM new_versions
    )
    {VERSION_CONTRIBUTION_SQL}
    RETURN NULL;
END $$;
CREATE FUNCTION ledger_version_tally_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH changed AS (
        SELECT id, item_id, number, input_tokens, output_tokens, usage, -1 AS sign FROM old_versions
    )
    {VERSION_CONTRIBUTION_SQL}
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_item_tally_insert AFTER INSERT ON ledger_item
    REFERENCING NEW TABLE AS new_items FOR EACH STATEMENT EXECUTE FUNCTION ledger_item_tally_insert();
CREATE TRIGGER ledger_item_tally_update AFTER UPDATE ON ledger_item
    REFERENCING OLD TABLE AS old_items NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_item_tally_update();
CREATE TRIGGER ledger_item_tally_delete AFTER DELETE ON ledger_item
    REFERENCING OLD TABLE AS old_items FOR EACH STATEMENT EXECUTE FUNCTION ledger_item_tally_delete();
CREATE TRIGGER ledger_version_tally_insert AFTER INSERT ON ledger_generatedversion
    REFERENCING NEW TABLE AS new_versions FOR EACH STATEMENT EXECUTE FUNCTION ledger_version_tally_insert();
CREATE TRIGGER ledger_version_tally_update AFTER UPDATE ON ledger_generatedversion
    REFERENCING OLD TABLE AS old_versions NEW TABLE AS new_versions
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_version_tally_change();
CREATE TRIGGER ledger_version_tally_delete AFTER DELETE ON ledger_generatedversion
    REFERENCING OLD TABLE AS old_versions FOR EACH STATEMENT EXECUTE FUNCTION ledger_version_tally_delete();
"""

POSTGRESQL_REVERSE_SQL = """
DROP TRIGGER IF EXISTS ledger_item_tally_insert ON ledger_item;
DROP TRIGGER IF EXISTS ledger_item_tally_update ON ledger_item;
DROP TRIGGER IF EXISTS ledger_item_tally_delete ON ledger_item;
DROP TRIGGER IF EXISTS ledger_version_tally_insert ON ledger_generatedversion;
DROP TRIGGER IF EXISTS ledger_version_tally_update ON ledger_generatedversion;
DROP TRIGGER IF EXISTS ledger_version_tally_delete ON ledger_generatedversion;
DROP FUNCTION IF EXISTS ledger_item_tally_insert();
DROP FUNCTION IF EXISTS ledger_item_tally_update();
DROP FUNCTION IF EXISTS ledger_item_tally_delete();
DROP FUNCTION IF EXISTS ledger_version_tally_insert();
DROP FUNCTION IF EXISTS ledger_version_tally_change();
DROP FUNCTION IF EXISTS ledger_version_tally_delete();
"""


# SQLite (the demo): the same contributions, row by row, installed by every migrate rather than
# here (`ledger.database.tallies`): SQLite rebuilds a table to alter it, which a trigger naming it would stop.


# The tallies of the rows that exist, computed as the triggers would have (in one statement each,
# on either database).
BACKFILL_SQL = [
    f"""INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, COUNT(*),
        COALESCE(SUM(CASE WHEN i.state IN {UNDECIDED} THEN latest.input_tokens END), 0),
        COALESCE(SUM(CASE WHEN i.state IN {UNDECIDED} THEN latest.output_tokens END), 0),
        COUNT(approved.id), COALESCE(SUM(approved.input_tokens), 0), COALESCE(SUM(approved.output_tokens), 0),
        0, 0, 0
    FROM ledger_item i
    LEFT JOIN ledger_generatedversion latest ON latest.item_id = i.id
        AND latest.number = (SELECT MAX(v.number) FROM ledger_generatedversion v WHERE v.item_id = i.id)
    LEFT JOIN ledger_generatedversion approved ON approved.id = i.approved_version_id
        AND i.state NOT IN {DISCARDED}
    GROUP BY i.job_id, i.state""",
    f"""INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, 0, 0, 0, 0, 0, 0, SUM(v.input_tokens), SUM(v.output_tokens),
        SUM(CASE WHEN {{apportioned}} THEN 1 ELSE 0 END)
    FROM ledger_generatedversion v JOIN ledger_item i ON i.id = v.item_id
    GROUP BY i.job_id, i.state""",
]
APPORTIONED = "v.usage -> 'apportioned' = 'true'::jsonb"


def install_tallies(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return  # ledger.database.tallies, after every migrate
    schema_editor.execute(POSTGRESQL_SQL)
    for statement in BACKFILL_SQL:
        schema_editor.execute(statement.replace("{apportioned}", APPORTIONED))


def remove_tallies(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_REVERSE_SQL)
    schema_editor.execute("DELETE FROM ledger_itemtally")


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0012_leaner_item_and_event_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="ItemTally",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("state", models.CharField(max_length=24)),
                ("items", models.BigIntegerField(default=0)),
                ("pending_input", models.BigIntegerField(default=0)),
                ("pending_output", models.BigIntegerField(default=0)),
                ("approved_drafts", models.BigIntegerField(default=0)),
                ("approved_input", models.BigIntegerField(default=0)),
                ("approved_output", models.BigIntegerField(default=0)),
                ("all_input", models.BigIntegerField(default=0)),
                ("all_output", models.BigIntegerField(default=0)),
                ("apportioned_drafts", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RemoveIndex(
            model_name="item",
            name="item_job_state",
        ),
        migrations.RemoveIndex(
            model_name="item",
            name="item_state_age",
        ),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(fields=["job", "state", "id"], name="item_job_state"),
        ),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(fields=["job", "id"], name="item_job"),
        ),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(fields=["state", "updated_at", "id"], name="item_state_age"),
        ),
        migrations.AddField(
            model_name="itemtally",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="ledger.job",
            ),
        ),
        migrations.AddIndex(
            model_name="itemtally",
            index=models.Index(fields=["job", "state"], name="item_tally_job"),
        ),
        migrations.RunPython(install_tallies, remove_tallies),
    ]

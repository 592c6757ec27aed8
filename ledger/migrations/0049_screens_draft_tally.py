"""Draft tallies (`DraftTally`): the drafts each job received in each quarter hour and their tokens,
kept by statement-level triggers on `ledger_generatedversion` in the same transaction as every
change, and counted here from the drafts that exist. The dashboard's spend of the day summed every
draft of the day (0.13 s for the 50,000 drafts of one unit, seconds on a day of a million); it now
sums a few rows. SQLite, the demo's database, gets the same triggers row by row after every
migrate (ledger/database/tallies.py)."""

import django.db.models.deletion
from django.db import migrations, models

# The quarter hour a draft was received in, on UTC's quarter hours: every time zone's midnight is one.
QUARTER = "date_bin('15 minutes', {at}, TIMESTAMPTZ '2000-01-01 00:00:00+00')"


def contribution(changed: str) -> str:
    """What the drafts of `changed` add: its rows are (unit, item, time received, 1 or -1, input
    tokens, output tokens), the tokens signed. A draft's job is its unit's (one unit is one job's
    work): the drafts are summed by unit first, so the thousands a collection writes in one
    statement meet one row of `ledger_submission`, not thousands of `ledger_item` (a quarter of
    the time); only a draft without a unit is joined to its item."""
    return f"""
    INSERT INTO ledger_drafttally (job_id, received, drafts, input_tokens, output_tokens)
    SELECT COALESCE(s.job_id, i.job_id), c.received, SUM(c.drafts), SUM(c.input_tokens), SUM(c.output_tokens)
    FROM (
        SELECT submission_id, CASE WHEN submission_id IS NULL THEN item_id END AS item_id,
               {QUARTER.format(at="created_at")} AS received,
               SUM(sign) AS drafts, SUM(input_tokens) AS input_tokens, SUM(output_tokens) AS output_tokens
        FROM ({changed}) AS changed (submission_id, item_id, created_at, sign, input_tokens, output_tokens)
        GROUP BY 1, 2, 3
    ) c
    LEFT JOIN ledger_submission s ON s.id = c.submission_id
    LEFT JOIN ledger_item i ON i.id = c.item_id
    -- A draft naming a unit or an item that does not exist adds nothing: the statement is refused,
    -- in words, by ledger_version_references_checked (migration 0018).
    WHERE s.job_id IS NOT NULL OR i.job_id IS NOT NULL
    GROUP BY 1, 2;"""


# What each statement changed: the drafts written; those whose unit, item, time or tokens changed,
# taken back and counted again (the retention pass erases texts, not tokens); the drafts deleted.
WRITTEN = "SELECT submission_id, item_id, created_at, 1, input_tokens, output_tokens FROM new_versions"
CHANGED = """
    SELECT counted.* FROM old_versions o JOIN new_versions n ON n.id = o.id
    CROSS JOIN LATERAL (
        VALUES (o.submission_id, o.item_id, o.created_at, -1, -o.input_tokens, -o.output_tokens),
               (n.submission_id, n.item_id, n.created_at, 1, n.input_tokens, n.output_tokens)
    ) counted
    WHERE (o.submission_id, o.item_id, o.created_at, o.input_tokens, o.output_tokens)
          IS DISTINCT FROM (n.submission_id, n.item_id, n.created_at, n.input_tokens, n.output_tokens)"""
DELETED = "SELECT submission_id, item_id, created_at, -1, -input_tokens, -output_tokens FROM old_versions"

POSTGRESQL_SQL = f"""
CREATE FUNCTION ledger_draft_tally_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {contribution(WRITTEN)}
    RETURN NULL;
END $$;
CREATE FUNCTION ledger_draft_tally_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {contribution(CHANGED)}
    RETURN NULL;
END $$;
CREATE FUNCTION ledger_draft_tally_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {contribution(DELETED)}
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_draft_tally_insert AFTER INSERT ON ledger_generatedversion
    REFERENCING NEW TABLE AS new_versions FOR EACH STATEMENT EXECUTE FUNCTION ledger_draft_tally_insert();
CREATE TRIGGER ledger_draft_tally_update AFTER UPDATE ON ledger_generatedversion
    REFERENCING OLD TABLE AS old_versions NEW TABLE AS new_versions
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_draft_tally_update();
CREATE TRIGGER ledger_draft_tally_delete AFTER DELETE ON ledger_generatedversion
    REFERENCING OLD TABLE AS old_versions FOR EACH STATEMENT EXECUTE FUNCTION ledger_draft_tally_delete();
INSERT INTO ledger_drafttally (job_id, received, drafts, input_tokens, output_tokens)
SELECT i.job_id, {QUARTER.format(at="v.created_at")}, COUNT(*), SUM(v.input_tokens), SUM(v.output_tokens)
FROM ledger_generatedversion v JOIN ledger_item i ON i.id = v.item_id
GROUP BY 1, 2;
"""

POSTGRESQL_REVERSE_SQL = """
DROP TRIGGER IF EXISTS ledger_draft_tally_insert ON ledger_generatedversion;
DROP TRIGGER IF EXISTS ledger_draft_tally_update ON ledger_generatedversion;
DROP TRIGGER IF EXISTS ledger_draft_tally_delete ON ledger_generatedversion;
DROP FUNCTION IF EXISTS ledger_draft_tally_insert();
DROP FUNCTION IF EXISTS ledger_draft_tally_update();
DROP FUNCTION IF EXISTS ledger_draft_tally_delete();
"""


def on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0048_no_statistics_for_text_nobody_filters")]

    operations = [
        migrations.CreateModel(
            name="DraftTally",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("received", models.DateTimeField()),
                ("drafts", models.BigIntegerField(default=0)),
                ("input_tokens", models.BigIntegerField(default=0)),
                ("output_tokens", models.BigIntegerField(default=0)),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="ledger.job",
                    ),
                ),
            ],
            options={"indexes": [models.Index(fields=["received"], name="draft_tally_received")]},
        ),
        # Reversed, the table goes with its rows; the triggers naming it go first.
        migrations.RunPython(on_postgresql(POSTGRESQL_SQL), on_postgresql(POSTGRESQL_REVERSE_SQL)),
    ]

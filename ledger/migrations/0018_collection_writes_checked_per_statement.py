"""What collecting a unit writes, made cheaper per row for the database, with the same guarantees:

- A draft's references (its item; its submission, of the item's job) are checked once per statement
  instead of by a foreign key once per row, as migration 0015 did for items and events: a statement
  with one wrong reference is refused whole (SQLSTATE 23503). A version never changes item; a changed
  submission is checked row by row. Rows pointed at are never deleted by the ledger (`PROTECT`).
- A draft's custom_id is unique by a constraint with one index (`unique=True` added a second one,
  for LIKE, which nothing asks), and its item is indexed by `version_number_unique` alone.
- A request's row (`ledger_submissionitem`) is written with room beside it (fillfactor 50), so
  marking it recorded, once, rewrites it in its own page without touching its indexes (a HOT update).
- The tally triggers look up each changed row's item or draft by its key (a `LIMIT 1` lateral)
  instead of letting the planner scan and hash the whole table for a few thousand rows.

SQLite, the demo's database, checks nothing here and keeps its row-by-row tallies (`ledger.database.tallies`).
"""

from django.db import migrations, models

UNDECIDED = "('returned', 'awaiting_review')"
DISCARDED = "('obsolete', 'withdrawn', 'cancelled')"
COLUMNS = (
    "job_id, state, items, pending_input, pending_output, approved_drafts, approved_input, "
    "approved_output, all_input, all_output, apportioned_drafts"
)

REFERENCES_SQL = """
CREATE FUNCTION ledger_version_references_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    SELECT n.id INTO wrong FROM new_versions n
    LEFT JOIN LATERAL (SELECT i.job_id FROM ledger_item i WHERE i.id = n.item_id LIMIT 1) item ON true
    WHERE item.job_id IS NULL
       OR (n.submission_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM ledger_submission s WHERE s.id = n.submission_id AND s.job_id = item.job_id
       ))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'version ' || wrong || ' refers to an item or a submission that does not exist, '
                      'or to a submission of another job';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_version_references_checked
    AFTER INSERT ON ledger_generatedversion REFERENCING NEW TABLE AS new_versions
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_version_references_checked();

CREATE FUNCTION ledger_version_reference_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.item_id IS DISTINCT FROM OLD.item_id OR NEW.submission_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM ledger_submission s JOIN ledger_item i ON i.job_id = s.job_id
        WHERE s.id = NEW.submission_id AND i.id = NEW.item_id
    ) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'version ' || NEW.id || ' would change its item, or refer to a submission that '
                      'does not exist or is of another job';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_version_reference_changed
    AFTER UPDATE OF item_id, submission_id ON ledger_generatedversion
    FOR EACH ROW
    WHEN ((NEW.item_id, NEW.submission_id) IS DISTINCT FROM (OLD.item_id, OLD.submission_id))
    EXECUTE FUNCTION ledger_version_reference_changed();

ALTER TABLE ledger_submissionitem SET (fillfactor = 50);
"""

REFERENCES_UNDO_SQL = """
ALTER TABLE ledger_submissionitem RESET (fillfactor);
DROP TRIGGER IF EXISTS ledger_version_reference_changed ON ledger_generatedversion;
DROP FUNCTION IF EXISTS ledger_version_reference_changed();
DROP TRIGGER IF EXISTS ledger_version_references_checked ON ledger_generatedversion;
DROP FUNCTION IF EXISTS ledger_version_references_checked();
"""


def tally_functions(*, by_key: bool) -> str:
    """Migration 0013's tally functions for an item's UPDATE and a draft's INSERT; `by_key`: each
    row's approved draft and item read by key (LIMIT 1 keeps the lateral from becoming a hash join)."""
    limit = "LIMIT 1" if by_key else ""
    item_of_version = (
        "CROSS JOIN LATERAL (SELECT x.job_id, x.state FROM ledger_item x WHERE x.id = n.item_id LIMIT 1) i"
        if by_key
        else "JOIN ledger_item i ON i.id = n.item_id"
    )
    return f"""
CREATE OR REPLACE FUNCTION ledger_item_tally_update() RETURNS trigger LANGUAGE plpgsql AS $$
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
        {limit}
    ) approved ON true
    GROUP BY c.job_id, c.state;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION ledger_version_tally_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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
    {item_of_version}
    LEFT JOIN LATERAL (
        SELECT p.input_tokens, p.output_tokens FROM ledger_generatedversion p
        WHERE i.state IN {UNDECIDED} AND p.item_id = n.item_id AND p.number < n.number
        ORDER BY p.number DESC LIMIT 1
    ) previous ON true
    GROUP BY i.job_id, i.state;
    RETURN NULL;
END $$;
"""


def on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0017_catalogue_search_trigrams_on_upper")]

    operations = [
        migrations.AlterField(
            model_name="generatedversion",
            name="custom_id",
            field=models.CharField(max_length=64),
        ),
        migrations.AddConstraint(
            model_name="generatedversion",
            constraint=models.UniqueConstraint(fields=("custom_id",), name="version_custom_id_unique"),
        ),
        migrations.AlterField(
            model_name="generatedversion",
            name="item",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=models.deletion.PROTECT,
                related_name="versions",
                to="ledger.item",
            ),
        ),
        migrations.AlterField(
            model_name="generatedversion",
            name="submission",
            field=models.ForeignKey(
                db_constraint=False,
                null=True,
                on_delete=models.deletion.PROTECT,
                related_name="versions",
                to="ledger.submission",
            ),
        ),
        migrations.RunPython(on_postgresql(REFERENCES_SQL), on_postgresql(REFERENCES_UNDO_SQL)),
        migrations.RunPython(
            on_postgresql(tally_functions(by_key=True)), on_postgresql(tally_functions(by_key=False))
        ),
    ]

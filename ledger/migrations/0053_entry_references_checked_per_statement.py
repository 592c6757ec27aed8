"""A unit's entries (`ledger_submissionitem`) have their item and submission checked by the database once
per statement, as items, events and drafts have theirs (migrations 0015, 0018, 0021), instead of by two
deferred foreign keys, each a check of every row queued to the commit.

Planning a unit writes its 5,000 entries in one statement; at its commit the keys' 10,000 checks, each
probing and locking the row it points at, took 36-54 ms of the database's time a unit at 1,200,000 items,
more than writing the entries. The statement-level check reads the statement's new rows together, planned
for the statement at hand (`EXECUTE`). The same rows are refused (SQLSTATE 23503; the row named is the
lowest wrong id), at the end of the statement rather than at the commit; a changed item or submission is
checked row by row. The ledger deletes no item and no submission (`PROTECT`). SQLite, the demo's
database, checks nothing here.
"""

from django.db import migrations, models

CHECKS_SQL = """
CREATE FUNCTION ledger_entry_references_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    EXECUTE $check$
        SELECT min(n.id) FROM new_entries n
        WHERE NOT EXISTS (SELECT 1 FROM ledger_item i WHERE i.id = n.item_id)
           OR NOT EXISTS (SELECT 1 FROM ledger_submission s WHERE s.id = n.submission_id)
    $check$ INTO wrong;
    IF wrong IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'entry ' || wrong || ' refers to an item or a submission that does not exist';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_entry_references_checked
    AFTER INSERT ON ledger_submissionitem REFERENCING NEW TABLE AS new_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entry_references_checked();

CREATE FUNCTION ledger_entry_reference_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ledger_item i WHERE i.id = NEW.item_id)
       OR NOT EXISTS (SELECT 1 FROM ledger_submission s WHERE s.id = NEW.submission_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'entry ' || NEW.id || ' would refer to an item or a submission that does not exist';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_entry_reference_changed
    AFTER UPDATE OF item_id, submission_id ON ledger_submissionitem
    FOR EACH ROW
    WHEN ((NEW.item_id, NEW.submission_id) IS DISTINCT FROM (OLD.item_id, OLD.submission_id))
    EXECUTE FUNCTION ledger_entry_reference_changed();
"""

CHECKS_UNDO_SQL = """
DROP TRIGGER IF EXISTS ledger_entry_reference_changed ON ledger_submissionitem;
DROP FUNCTION IF EXISTS ledger_entry_reference_changed();
DROP TRIGGER IF EXISTS ledger_entry_references_checked ON ledger_submissionitem;
DROP FUNCTION IF EXISTS ledger_entry_references_checked();
"""


def on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0052_no_statistics_for_digests_nobody_filters")]

    operations = [
        migrations.AlterField(
            model_name="submissionitem",
            name="item",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=models.deletion.PROTECT,
                related_name="submission_entries",
                to="ledger.item",
            ),
        ),
        migrations.AlterField(
            model_name="submissionitem",
            name="submission",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=models.deletion.PROTECT,
                related_name="entries",
                to="ledger.submission",
            ),
        ),
        migrations.RunPython(on_postgresql(CHECKS_SQL), on_postgresql(CHECKS_UNDO_SQL)),
    ]

"""A change of an item's references (its submission, its approved draft; its job, product and revision
never change) is checked by the database once per statement, as an item's new references are (migrations
0015 and 0021), instead of once per changed row.

Planning a unit points its 5,000 items at their submission in one statement; the per-row check called a
trigger function and probed `ledger_submission` for each of them: 0.14-0.25 s of the database's time a
unit (a million items: about a minute), nine tenths of the planning statement. The statement-level check
reads the statement's old and new rows together, planned for the statement at hand (`EXECUTE`), and
checks only the references that changed: 3-17 ms for a unit; an update that changes none (a state, a
time) joins its rows and finds nothing to check, 3-9 ms for 5,000 rows. The same changes are refused
with the same error (SQLSTATE 23503); the row named is the lowest wrong id.
"""

from django.db import migrations

PER_STATEMENT_SQL = """
DROP TRIGGER IF EXISTS ledger_item_reference_changed ON ledger_item;
DROP FUNCTION IF EXISTS ledger_item_reference_changed();

CREATE FUNCTION ledger_item_references_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    EXECUTE $check$
        SELECT min(n.id) FROM new_items n JOIN old_items o ON o.id = n.id
        WHERE (n.job_id, n.product_id, n.source_revision_id)
              IS DISTINCT FROM (o.job_id, o.product_id, o.source_revision_id)
           OR (n.approved_version_id IS DISTINCT FROM o.approved_version_id
               AND n.approved_version_id IS NOT NULL AND NOT EXISTS (
                   SELECT 1 FROM ledger_generatedversion v WHERE v.id = n.approved_version_id AND v.item_id = n.id
               ))
           OR (n.submission_id IS DISTINCT FROM o.submission_id
               AND n.submission_id IS NOT NULL AND NOT EXISTS (
                   SELECT 1 FROM ledger_submission s WHERE s.id = n.submission_id AND s.job_id = n.job_id
               ))
    $check$ INTO wrong;
    IF wrong IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'item ' || wrong || ' would refer to a draft or submission that does not exist '
                      'or is not its own, or change its job, product or revision';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_item_references_changed
    AFTER UPDATE ON ledger_item REFERENCING OLD TABLE AS old_items NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_item_references_changed();
"""

# Migration 0015's check, as it was.
PER_ROW_SQL = """
DROP TRIGGER IF EXISTS ledger_item_references_changed ON ledger_item;
DROP FUNCTION IF EXISTS ledger_item_references_changed();

CREATE FUNCTION ledger_item_reference_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.approved_version_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM ledger_generatedversion v WHERE v.id = NEW.approved_version_id AND v.item_id = NEW.id
    ) OR NEW.submission_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM ledger_submission s WHERE s.id = NEW.submission_id AND s.job_id = NEW.job_id
    ) OR (NEW.job_id, NEW.product_id, NEW.source_revision_id)
         IS DISTINCT FROM (OLD.job_id, OLD.product_id, OLD.source_revision_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'item ' || NEW.id || ' would refer to a draft or submission that does not exist '
                      'or is not its own, or change its job, product or revision';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_item_reference_changed
    AFTER UPDATE OF job_id, product_id, source_revision_id, approved_version_id, submission_id ON ledger_item
    FOR EACH ROW
    WHEN ((NEW.job_id, NEW.product_id, NEW.source_revision_id, NEW.approved_version_id, NEW.submission_id)
          IS DISTINCT FROM (OLD.job_id, OLD.product_id, OLD.source_revision_id, OLD.approved_version_id,
                            OLD.submission_id))
    EXECUTE FUNCTION ledger_item_reference_changed();
"""


def per_statement(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PER_STATEMENT_SQL)


def per_row(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PER_ROW_SQL)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0049_screens_draft_tally")]

    operations = [migrations.RunPython(per_statement, per_row)]

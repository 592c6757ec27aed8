"""An item's and an event's references (job, product, source revision, approved draft, submission;
an event's item, job, submission and actor) are checked by the database once per statement instead of by
a foreign key once per row.

A foreign key queues a check for every inserted row and locks every row it points at: creating a
job of a million items made nine million such checks, most of the job's time. On PostgreSQL a
statement-level trigger now reads the statement's new rows at once and refuses the whole statement
(SQLSTATE 23503, an IntegrityError in Django) when one of them points at nothing, or at a revision
of another product, a draft of another item, a submission or an item of another job. Changing an
item's approved draft or submission is checked row by row, as before. Rows pointed at are never
deleted by the ledger (`on_delete=PROTECT` refuses it in Django); SQLite, the demo's database,
checks nothing here.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

POSTGRESQL_SQL = """
CREATE FUNCTION ledger_item_references_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    SELECT n.id INTO wrong FROM new_items n
    WHERE NOT EXISTS (SELECT 1 FROM ledger_job j WHERE j.id = n.job_id)
       OR NOT EXISTS (
           SELECT 1 FROM ledger_sourcerevision r WHERE r.id = n.source_revision_id AND r.product_id = n.product_id
       )
       OR (n.approved_version_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM ledger_generatedversion v WHERE v.id = n.approved_version_id AND v.item_id = n.id
       ))
       OR (n.submission_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM ledger_submission s WHERE s.id = n.submission_id AND s.job_id = n.job_id
       ))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'item ' || wrong || ' refers to a job, product, source revision, draft or submission '
                      'that does not exist or is not its own';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_item_references_checked
    AFTER INSERT ON ledger_item REFERENCING NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_item_references_checked();

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

CREATE FUNCTION ledger_event_references_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    SELECT n.id INTO wrong FROM new_events n
    WHERE (n.job_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ledger_job j WHERE j.id = n.job_id))
       OR (n.item_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM ledger_item i WHERE i.id = n.item_id AND i.job_id IS NOT DISTINCT FROM COALESCE(n.job_id, i.job_id)
       ))
       OR (n.submission_id IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM ledger_submission s WHERE s.id = n.submission_id
       ))
       OR (n.actor_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM auth_user u WHERE u.id = n.actor_id))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'event ' || wrong || ' refers to a job, item, submission or user that does not '
                      'exist, or to an item of another job';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_event_references_checked
    AFTER INSERT ON ledger_event REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_event_references_checked();
"""

POSTGRESQL_UNDO_SQL = """
DROP TRIGGER IF EXISTS ledger_event_references_checked ON ledger_event;
DROP FUNCTION IF EXISTS ledger_event_references_checked();
DROP TRIGGER IF EXISTS ledger_item_reference_changed ON ledger_item;
DROP FUNCTION IF EXISTS ledger_item_reference_changed();
DROP TRIGGER IF EXISTS ledger_item_references_checked ON ledger_item;
DROP FUNCTION IF EXISTS ledger_item_references_checked();
"""


def install_checks(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_SQL)


def remove_checks(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_UNDO_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0014_screens_at_scale"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="item",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="ledger.item",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="ledger.job",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="submission",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="ledger.submission",
            ),
        ),
        migrations.AlterField(
            model_name="item",
            name="approved_version",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="ledger.generatedversion",
            ),
        ),
        migrations.AlterField(
            model_name="item",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="items",
                to="ledger.job",
            ),
        ),
        migrations.AlterField(
            model_name="item",
            name="product",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="items",
                to="ledger.product",
            ),
        ),
        migrations.AlterField(
            model_name="item",
            name="source_revision",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="items",
                to="ledger.sourcerevision",
            ),
        ),
        migrations.AlterField(
            model_name="item",
            name="submission",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="items",
                to="ledger.submission",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="actor",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(install_checks, remove_checks),
    ]

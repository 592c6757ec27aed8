"""An event statement's item references are probed by key when the statement is small beside the
table of items, and matched in one hashed pass only when it is not (migration 0021's plan).

0021 left the choice to the planner. For a collection's chunk (10,000 events of 5,000 drafts, beside
a job of 50,000 items) it hashed every item of the table, through an index whose rows are mostly not
yet visible to all (`Heap Fetches`: every version an item's moves left), for 10,000 keys: 63 ms a
chunk, the costliest of the chunk's triggers (886 ms of a 50,000-line collection's database time,
more than the item tallies and both checks of the drafts together). Probing the same 10,000 keys
takes 30 ms. The planner cannot tell: the index's unvisited rows are not in its costs.

So the check counts the statement's rows first: under a quarter of the items the statistics know,
each item is looked up by its key (a lateral lookup, which the planner cannot turn into a hashed
join); otherwise, as for a new job's million events, the one hashed pass, as before. The same rows are
refused with the same error (SQLSTATE 23503); the row named is the lowest wrong id. The cheap references
(job, submission, user: small tables, hashed once) are read as before."""

from django.db import migrations

# What both ways check besides the items: a job, a submission and a user that exist.
OTHER_REFERENCES = """
                UNION ALL
                SELECT n.id FROM new_events n
                WHERE (n.job_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ledger_job j WHERE j.id = n.job_id))
                   OR (n.submission_id IS NOT NULL AND NOT EXISTS (
                       SELECT 1 FROM ledger_submission s WHERE s.id = n.submission_id
                   ))
                   OR (n.actor_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM auth_user u WHERE u.id = n.actor_id))
"""

# An item's job is never null: a missing item, or one of another job than the event names, is wrong.
ITEMS_PROBED = """
                SELECT n.id FROM new_events n
                LEFT JOIN LATERAL (SELECT i.job_id FROM ledger_item i WHERE i.id = n.item_id LIMIT 1) item ON true
                WHERE n.item_id IS NOT NULL
                  AND (item.job_id IS NULL OR item.job_id <> COALESCE(n.job_id, item.job_id))
"""

ITEMS_HASHED = """
                SELECT n.id FROM new_events n
                WHERE n.item_id IS NOT NULL AND NOT EXISTS (
                    SELECT 1 FROM ledger_item i
                    WHERE i.id = n.item_id AND i.job_id IS NOT DISTINCT FROM COALESCE(n.job_id, i.job_id)
                )
"""

RAISE_SQL = """
    IF wrong IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'event ' || wrong || ' refers to a job, item, submission or user that does not '
                      'exist, or to an item of another job';
    END IF;
    RETURN NULL;
"""

BY_SIZE_SQL = f"""
CREATE OR REPLACE FUNCTION ledger_event_references_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
    new_rows bigint;
    items_known real;
BEGIN
    SELECT count(*) INTO new_rows FROM new_events;
    -- -1 for a table never analysed: hashed, as before.
    SELECT reltuples INTO items_known FROM pg_class WHERE oid = 'ledger_item'::regclass;
    IF new_rows * 4 < items_known THEN
        EXECUTE $check$ SELECT min(id) FROM ({ITEMS_PROBED}{OTHER_REFERENCES}) wrong_rows $check$ INTO wrong;
    ELSE
        EXECUTE $check$ SELECT min(id) FROM ({ITEMS_HASHED}{OTHER_REFERENCES}) wrong_rows $check$ INTO wrong;
    END IF;
{RAISE_SQL}
END $$;
"""

# Migration 0021's function, as it was.
PLANNER_CHOOSES_SQL = f"""
CREATE OR REPLACE FUNCTION ledger_event_references_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    EXECUTE $check$ SELECT min(id) FROM ({ITEMS_HASHED}{OTHER_REFERENCES}) wrong_rows $check$ INTO wrong;
{RAISE_SQL}
END $$;
"""


def by_size(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BY_SIZE_SQL)


def planner_chooses(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PLANNER_CHOOSES_SQL)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0050_item_references_changed_per_statement")]

    operations = [migrations.RunPython(by_size, planner_chooses)]

"""A product's current revision and a revision's product are checked by the database once per
statement instead of by a foreign key once per row.

The two foreign keys pointed at each other, so both were deferred to the commit, where each new
product and each new revision ran a query and locked the row it points at: an import of 100,000 new
products spent 1.2 s of the database's CPU and 3-4 s in all at its commit on them alone. On
PostgreSQL, statement-level triggers now read a statement's new rows at once and refuse the whole
statement (SQLSTATE 23503, an IntegrityError in Django) when a product points at a revision that does
not exist or a revision at a product that does not exist. The import writes new products and their
first revisions in one statement (triggers run at its end, when both are there); Django's writers
create the product, then its revision, then point the product at it. A change of either reference
is checked row by row, and deleting a product that revisions belong to, or a revision a product
points at, is refused (Django's `on_delete=PROTECT` refuses it first). Revisions are found by
product through `revision_number_unique` (product, number): the index of revisions by product alone
is gone. SQLite, the demo's database, checks nothing here.
"""

import django.db.models.deletion
from django.db import migrations, models

POSTGRESQL_SQL = """
CREATE FUNCTION ledger_product_revision_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    SELECT n.id INTO wrong FROM new_products n
    WHERE n.current_revision_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM ledger_sourcerevision r WHERE r.id = n.current_revision_id)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'product ' || wrong || ' refers to a source revision that does not exist';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_product_revision_checked
    AFTER INSERT ON ledger_product REFERENCING NEW TABLE AS new_products
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_product_revision_checked();

CREATE FUNCTION ledger_product_revision_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ledger_sourcerevision r WHERE r.id = NEW.current_revision_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'product ' || NEW.id || ' would refer to a source revision that does not exist';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_product_revision_changed
    AFTER UPDATE OF current_revision_id ON ledger_product
    FOR EACH ROW
    WHEN (NEW.current_revision_id IS NOT NULL
          AND NEW.current_revision_id IS DISTINCT FROM OLD.current_revision_id)
    EXECUTE FUNCTION ledger_product_revision_changed();

CREATE FUNCTION ledger_revision_product_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wrong bigint;
BEGIN
    SELECT n.id INTO wrong FROM new_revisions n
    WHERE NOT EXISTS (SELECT 1 FROM ledger_product p WHERE p.id = n.product_id)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'source revision ' || wrong || ' refers to a product that does not exist';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_revision_product_checked
    AFTER INSERT ON ledger_sourcerevision REFERENCING NEW TABLE AS new_revisions
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_revision_product_checked();

CREATE FUNCTION ledger_revision_product_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ledger_product p WHERE p.id = NEW.product_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'source revision ' || NEW.id || ' would refer to a product that does not exist';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_revision_product_changed
    AFTER UPDATE OF product_id ON ledger_sourcerevision
    FOR EACH ROW WHEN (NEW.product_id IS DISTINCT FROM OLD.product_id)
    EXECUTE FUNCTION ledger_revision_product_changed();

CREATE FUNCTION ledger_product_revisions_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM gone_products g WHERE EXISTS (SELECT 1 FROM ledger_sourcerevision r WHERE r.product_id = g.id)
    ) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'a product with source revisions cannot be deleted';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_product_revisions_kept
    AFTER DELETE ON ledger_product REFERENCING OLD TABLE AS gone_products
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_product_revisions_kept();

CREATE FUNCTION ledger_revision_kept_while_current() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM gone_revisions g WHERE EXISTS (SELECT 1 FROM ledger_product p WHERE p.current_revision_id = g.id)
    ) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'a product''s current source revision cannot be deleted';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_revision_kept_while_current
    AFTER DELETE ON ledger_sourcerevision REFERENCING OLD TABLE AS gone_revisions
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_revision_kept_while_current();
"""

POSTGRESQL_UNDO_SQL = """
DROP TRIGGER IF EXISTS ledger_revision_kept_while_current ON ledger_sourcerevision;
DROP FUNCTION IF EXISTS ledger_revision_kept_while_current();
DROP TRIGGER IF EXISTS ledger_product_revisions_kept ON ledger_product;
DROP FUNCTION IF EXISTS ledger_product_revisions_kept();
DROP TRIGGER IF EXISTS ledger_revision_product_changed ON ledger_sourcerevision;
DROP FUNCTION IF EXISTS ledger_revision_product_changed();
DROP TRIGGER IF EXISTS ledger_revision_product_checked ON ledger_sourcerevision;
DROP FUNCTION IF EXISTS ledger_revision_product_checked();
DROP TRIGGER IF EXISTS ledger_product_revision_changed ON ledger_product;
DROP FUNCTION IF EXISTS ledger_product_revision_changed();
DROP TRIGGER IF EXISTS ledger_product_revision_checked ON ledger_product;
DROP FUNCTION IF EXISTS ledger_product_revision_checked();
"""


def install_checks(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_SQL)


def remove_checks(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_UNDO_SQL)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0022_unplanned_items_index")]

    operations = [
        migrations.AlterField(
            model_name="product",
            name="current_revision",
            field=models.ForeignKey(
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="ledger.sourcerevision",
            ),
        ),
        migrations.AlterField(
            model_name="sourcerevision",
            name="product",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="revisions",
                to="ledger.product",
            ),
        ),
        migrations.RunPython(install_checks, remove_checks),
    ]

"""A product remembers the digest of the catalogue line that made it what it is now, so an
unchanged re-import recognises a line it has met before without reading it (`ledger.catalogue`).

On PostgreSQL a trigger clears the digest whenever the product's current revision or status
changes by any other means (the API, the screens, a re-import of different content): the line no
longer describes the product. The import writes a new digest in the same statement as the change,
which the trigger leaves alone. SQLite, the demo's database, never recognises lines, so it needs no
trigger.
"""

from django.db import migrations, models

POSTGRESQL_SQL = """
CREATE FUNCTION ledger_product_line_digest_cleared() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.line_digest := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER ledger_product_line_digest_cleared
    BEFORE UPDATE OF current_revision_id, status ON ledger_product
    FOR EACH ROW
    WHEN (NEW.line_digest IS NOT DISTINCT FROM OLD.line_digest
          AND (NEW.current_revision_id IS DISTINCT FROM OLD.current_revision_id
               OR NEW.status IS DISTINCT FROM OLD.status))
    EXECUTE FUNCTION ledger_product_line_digest_cleared();
"""

POSTGRESQL_REVERSE_SQL = """
DROP TRIGGER ledger_product_line_digest_cleared ON ledger_product;
DROP FUNCTION ledger_product_line_digest_cleared();
"""


def install_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_SQL)


def remove_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_REVERSE_SQL)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0018_collection_writes_checked_per_statement")]

    operations = [
        migrations.AddField(
            model_name="product",
            name="line_digest",
            field=models.BinaryField(editable=False, null=True),
        ),
        migrations.RunPython(install_trigger, remove_trigger),
    ]

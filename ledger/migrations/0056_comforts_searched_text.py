"""The catalogue search reads a revision's title without accents and in
upper case (`ledger/database/searched_text.py`): the function `bd_searched`, and on PostgreSQL a
trigram index on it, which takes the place of the title's (migration 0017). An index on the
expression, not a stored column: a first import of 50,000 products kept a fifth of its speed less
with the column (bench, alternated), and the title's function costs little where a search reads it.

`unaccent` is a trusted extension (PostgreSQL 13 and later): the deployment's user creates it as the
database's owner, as pg_trgm (migration 0014). The functions name their schemas, so that a restore
(which runs with an empty search_path) can build the index."""

from django.db import migrations


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite: each connection is given the function (searched_text.py); no index
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS unaccent")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT extnamespace::regnamespace::text, current_schema() FROM pg_extension WHERE extname = 'unaccent'"
        )
        extension, ours = cursor.fetchone()
    schema_editor.execute(
        f"CREATE OR REPLACE FUNCTION {ours}.bd_unaccent(text) RETURNS text LANGUAGE sql IMMUTABLE "
        f"PARALLEL SAFE STRICT AS $$ SELECT {extension}.unaccent('{extension}.unaccent'::regdictionary, $1) $$"
    )
    schema_editor.execute(
        f"CREATE OR REPLACE FUNCTION {ours}.bd_searched(title text) RETURNS text LANGUAGE sql "
        f"IMMUTABLE PARALLEL SAFE AS $$ SELECT upper({ours}.bd_unaccent(coalesce(title, ''))) $$"
    )
    schema_editor.execute(
        "CREATE INDEX revision_searched_trgm ON ledger_sourcerevision "
        f"USING gin (({ours}.bd_searched(title)) gin_trgm_ops)"
    )
    schema_editor.execute("DROP INDEX IF EXISTS revision_title_trgm")
    schema_editor.execute("ANALYZE ledger_sourcerevision")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "CREATE INDEX IF NOT EXISTS revision_title_trgm ON ledger_sourcerevision "
        "USING gin ((upper(title::text)) gin_trgm_ops)"
    )
    schema_editor.execute("DROP INDEX IF EXISTS revision_searched_trgm")
    schema_editor.execute("DROP FUNCTION IF EXISTS bd_searched(text)")
    schema_editor.execute("DROP FUNCTION IF EXISTS bd_unaccent(text)")


class Migration(migrations.Migration):
    dependencies = [("ledger", "0055_blind_arm_preferences")]

    operations = [migrations.RunPython(forwards, backwards)]

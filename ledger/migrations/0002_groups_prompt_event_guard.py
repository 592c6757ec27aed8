"""The database guard on events. (The roles and the default prompt, made here at first, are put in
place by every migrate since: `ledger.bootstrap`.)"""

from django.db import migrations

EVENT_GUARD_SQL = """
CREATE OR REPLACE FUNCTION ledger_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'ledger events are append-only: ' || TG_OP || ' refused';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_event_append_only
    BEFORE UPDATE OR DELETE ON ledger_event
    FOR EACH ROW EXECUTE FUNCTION ledger_event_append_only();
"""

EVENT_GUARD_REVERSE_SQL = """
DROP TRIGGER IF EXISTS ledger_event_append_only ON ledger_event;
DROP FUNCTION IF EXISTS ledger_event_append_only();
"""


def install_event_guard(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(EVENT_GUARD_SQL)


def remove_event_guard(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(EVENT_GUARD_REVERSE_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunPython(install_event_guard, remove_event_guard),
    ]

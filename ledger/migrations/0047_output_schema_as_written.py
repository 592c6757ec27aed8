"""A prompt version's output schema is kept as written, properties in their author's order (SPEC rule
19): a `json` column on PostgreSQL, no longer `jsonb`, which sorts an object's keys (shorter names
first). SQLite kept the text already.

Versions stored before this keep the order `jsonb` gave them: it never kept the author's, so nothing
can recover it. They are converted as they read and go on sending what they sent before; a new
version written in the order wanted sends that order."""

from django.db import migrations

import ledger.database.json_as_written


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0046_pilot_decision_accuracy"),
    ]

    operations = [
        migrations.AlterField(
            model_name="promptversion",
            name="output_schema",
            field=ledger.database.json_as_written.JSONAsWrittenField(),
        ),
    ]

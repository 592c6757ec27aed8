from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0028_draft_notes_and_stop_reasons"),
    ]

    operations = [
        migrations.AddField(
            model_name="submission",
            name="slowed_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

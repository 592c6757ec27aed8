from django.db import migrations, models

# Units settled before the field existed: their longest answer, read once from their drafts (one
# statement), so a job with a budget lowers its max_tokens from what was measured before too.
BACKFILL = """
UPDATE ledger_unitcharge SET largest_output = (
    SELECT MAX(v.output_tokens) FROM ledger_generatedversion v
    WHERE v.submission_id = ledger_unitcharge.submission_id
)
WHERE settled_at IS NOT NULL
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0042_provider_hooks"),
    ]

    operations = [
        migrations.AddField(
            model_name="unitcharge",
            name="largest_output",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]

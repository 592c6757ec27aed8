"""A job's planning is claimed by whoever plans it (a planning task, or a send planning the next
unit), so the collector's passes queue no second planning task while one is queued or running: at
1,200,000 items a new job had 24 planning tasks queued, all but one finding nothing to plan."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0023_product_references_checked_per_statement")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="planning_claimed_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

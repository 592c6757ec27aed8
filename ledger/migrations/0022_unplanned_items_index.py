"""Items waiting to be planned into a unit (`prepared`, in no unit yet) get an index of their own.

A planned item stays `prepared` until its unit is sent, so planning the next unit of a job, and the
collector's look each pass for a job with items to plan, read through `item_job_state` past every
item planned before: planning a 100,000-item job into 200 units took 47 s, and each pass read every
planned but unsent item again.

A job that names no unit size now takes 5,000 requests a unit, not 500 (why: `DEFAULT_UNIT_SIZE`)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0021_references_checked_in_one_pass")]

    operations = [
        migrations.AlterField(
            model_name="job", name="unit_size", field=models.PositiveIntegerField(default=5000)
        ),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(
                condition=models.Q(("state", "prepared"), ("submission__isnull", True)),
                fields=["job", "id"],
                name="item_unplanned",
            ),
        ),
    ]

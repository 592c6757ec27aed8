"""Creating a job writes a million items and a million events: each index on them is a million
entries more to write. Three that nothing needs at that size are narrowed or dropped:

- `ledger_item.source_revision_id`'s own index: nothing looks items up by revision alone (a job's
  item for a revision is found by `item_once_per_revision`, a product's items by
  `item_product_state`).
- `item_state_age` leaves out `prepared` and `submitted` items, the states every item of a new job
  passes through together, which nothing lists across jobs by age (the review queue, the operations
  screen and the applying pass read the other states).
- `event_job` indexes a job's own events only (no item): an item's events are found by `event_item`.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0019_product_line_digest")]

    operations = [
        migrations.AlterField(
            model_name="item",
            name="source_revision",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="items",
                to="ledger.sourcerevision",
            ),
        ),
        migrations.RemoveIndex(model_name="item", name="item_state_age"),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(
                condition=models.Q(("state__in", ["prepared", "submitted"]), _negated=True),
                fields=["state", "updated_at", "id"],
                name="item_state_age",
            ),
        ),
        migrations.RemoveIndex(model_name="event", name="event_job"),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("item__isnull", True)), fields=["job", "id"], name="event_job"
            ),
        ),
    ]

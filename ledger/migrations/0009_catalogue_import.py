# Placeholder in the chain; filled by the change named in its file name.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("ledger", "0008_item_reason_code")]

    operations = []

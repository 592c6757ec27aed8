# API tokens may expire and be revoked (issue 7, SPEC §5).
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0006_publication")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(blank=True, help_text="Empty: never expires", null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

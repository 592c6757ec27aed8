from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0007_api_token_expiry")]

    operations = [
        migrations.AlterField(
            model_name="submission",
            name="state",
            field=models.CharField(
                choices=[
                    ("intent", "Recorded; not yet sent to the provider"),
                    ("uncertain", "Sent, but the provider's answer was lost; being reconciled"),
                    ("open", "Accepted by the provider; waiting for results"),
                    ("ended", "Provider finished; results being collected"),
                    ("collected", "All results collected"),
                    ("failed", "Not run: refused by the provider, never received, or nothing left to send"),
                ],
                default="intent",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="submission",
            name="cancel_answered_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

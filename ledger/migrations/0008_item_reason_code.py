from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0007_api_token_expiry")]

    operations = [
        migrations.AddField(
            model_name="item",
            name="reason_code",
            field=models.CharField(
                blank=True,
                max_length=32,
                choices=[
                    ("model_server_error", "The model produced no draft: server error"),
                    ("batch_expired", "The model produced no draft: the batch expired before it ran"),
                    ("rate_limited", "The model produced no draft: rate limited"),
                    ("timed_out", "The model produced no draft: timed out"),
                    ("missing_result", "The provider returned no result for this request"),
                    ("request_invalid", "The provider refused the request as invalid"),
                    ("batch_refused", "The provider refused the whole batch"),
                    ("unreadable_result", "The provider's result for this request could not be read"),
                    ("model_failed", "The model produced no draft"),
                    ("not_json", "Not the JSON the prompt asked for"),
                    ("schema_mismatch", "Does not match the output schema"),
                    ("too_short", "Too short"),
                    ("too_long", "Too long"),
                    ("unstated_claim", "Claims a word the source does not state"),
                    ("rejected_by_reviewer", "Rejected by a reviewer"),
                    ("destination_refused", "The destination refused the draft"),
                    ("destination_unconfigured", "The destination is not configured"),
                    ("destination_failing", "The destination kept failing"),
                    ("product_changed", "The product changed"),
                    ("product_withdrawn", "The product was withdrawn"),
                    ("answer_lost", "Unclear whether the provider received the batch"),
                    ("job_cancelled", "The job was cancelled"),
                ],
            ),
        ),
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

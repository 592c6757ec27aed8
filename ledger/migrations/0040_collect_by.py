"""Collect-by deadlines and provider-side clean-up (issue 20, SPEC §11). Units collected before
this migration whose provider lets files be deleted (OpenAI and the emulator, Gemini) are marked
too, so the collector's pass frees the provider's storage they still hold."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0039_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="submission",
            name="at_risk_from",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="submission",
            name="collect_by",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="submission",
            name="ended_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="submission",
            name="files_deleted_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="submission",
            name="files_to_delete",
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name="item",
            name="reason_code",
            field=models.CharField(
                blank=True,
                choices=[
                    ("model_server_error", "The model produced no draft: server error"),
                    ("batch_expired", "The model produced no draft: the batch expired before it ran"),
                    ("rate_limited", "The model produced no draft: rate limited"),
                    ("timed_out", "The model produced no draft: timed out"),
                    ("missing_result", "The provider returned no result for this request"),
                    ("request_invalid", "The provider refused the request as invalid"),
                    ("batch_refused", "The provider refused the whole batch"),
                    ("results_unavailable", "The provider would not hand over the batch's results"),
                    ("results_expired", "The provider deleted the results before they were collected"),
                    ("unreadable_result", "The provider's result for this request could not be read"),
                    ("answer_too_large", "The model's answer is larger than BatchDesk keeps"),
                    ("garbled_answer", "The model's answer holds characters no text can keep"),
                    ("model_failed", "The model produced no draft"),
                    ("not_json", "Not the JSON the prompt asked for"),
                    (
                        "truncated",
                        "The model's answer was cut off at its length limit (the same limit would cut it again)",
                    ),
                    ("refused_by_model", "The model refused to answer (its words shown)"),
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
                max_length=32,
            ),
        ),
        migrations.AddIndex(
            model_name="submission",
            index=models.Index(
                condition=models.Q(("files_to_delete", True)),
                fields=["id"],
                name="submission_files_to_delete",
            ),
        ),
        migrations.RunSQL(
            "UPDATE ledger_submission SET files_to_delete = true"
            " WHERE state = 'collected' AND provider IN ('openai', 'emulator', 'gemini')",
            migrations.RunSQL.noop,
        ),
    ]

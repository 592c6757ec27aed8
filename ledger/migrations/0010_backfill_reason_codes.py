"""Reason codes for items that stopped before codes existed, read once from their reason's words
(the way the operations page used to group them), so that they keep their groups after an upgrade.
From now on every verb records the code itself."""

import re

from django.db import migrations

MODEL_FAILURES = {
    "server_error": "model_server_error",
    "batch_expired": "batch_expired",
    "rate_limit_exceeded": "rate_limited",
    "timeout": "timed_out",
    "missing_result": "missing_result",
    "invalid_request_error": "request_invalid",
    "batch_failed": "batch_refused",
    "unreadable_result": "unreadable_result",
}
VALIDATION_FAILURES = (
    ("Claims ", "unstated_claim"),
    ("Too short", "too_short"),
    ("Too long", "too_long"),
    ("The draft is not the JSON", "not_json"),
    ("Does not match the output schema", "schema_mismatch"),
)
BY_STATE = {
    "rejected": "rejected_by_reviewer",
    "obsolete": "product_changed",
    "withdrawn": "product_withdrawn",
    "submission_uncertain": "answer_lost",
    "cancelled": "job_cancelled",
}


def model_failure(reason: str) -> str:
    if reason.startswith("The provider refused the batch"):
        return "batch_refused"
    return MODEL_FAILURES.get(reason.split(":", 1)[0].strip(), "model_failed")


def code_for(state: str, reason: str, *, approved: bool) -> str:
    if state in BY_STATE:
        return BY_STATE[state]
    if state == "inference_failed":
        return model_failure(reason)
    if state == "validation_failed":
        return next((code for start, code in VALIDATION_FAILURES if reason.startswith(start)), "")
    if state == "destination_rejected":
        if reason.startswith("Destination not configured"):
            return "destination_unconfigured"
        if reason.endswith("the product was withdrawn"):
            return "product_withdrawn"
        if reason.endswith("the product changed since approval"):
            return "product_changed"
        return "destination_refused"
    if state == "dead_letter":
        if approved:
            return "destination_failing"
        given_up = re.match(r"Gave up after \d+ attempts?: (.*)", reason, re.DOTALL)
        return model_failure(given_up.group(1)) if given_up else "model_failed"
    return ""


def backfill(apps, schema_editor):
    Item = apps.get_model("ledger", "Item")
    stopped = Item.objects.filter(reason_code="").exclude(reason="").exclude(
        state__in=["prepared", "submitted", "returned", "awaiting_review", "approved", "applying", "applied"]
    )
    batch = []
    for item in stopped.only("pk", "state", "reason", "approved_version_id").iterator(chunk_size=2000):
        item.reason_code = code_for(item.state, item.reason, approved=item.approved_version_id is not None)
        if item.reason_code:
            batch.append(item)
        if len(batch) == 2000:
            Item.objects.bulk_update(batch, ["reason_code"])
            batch = []
    Item.objects.bulk_update(batch, ["reason_code"])


class Migration(migrations.Migration):
    dependencies = [("ledger", "0009_catalogue_import")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]

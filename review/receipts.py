"""A job's receipts on its page, and as a CSV for the finance team (`/jobs/{id}/receipts.csv`): one
settled unit a row, as `ledger.money.receipts` reads it (the API's `GET /api/jobs/{id}/charges` gives
the same rows). The page shows the first RECEIPTS_SHOWN and links to the CSV, which streams them all.
In the CSV every cell is quoted and a cell a spreadsheet would run as a formula starts with `'`, as in
the job's export (`review.job_export`)."""

import csv
from collections.abc import Iterator

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from ledger.models import Job
from ledger.money import receipts
from ledger.money.pricing import job_cost

from .audit import BYTE_ORDER_MARK, Echo
from .job_export import csv_values, file_name, utc_text
from .permissions import VIEWERS, role_required
from .streaming import streamed_file

RECEIPTS_SHOWN = 50
# Read from the database a batch at a time while the CSV streams.
CSV_BATCH = 2000

CSV_COLUMNS = (
    "submission",
    "provider_ref",
    "settled_at",
    "input_tokens",
    "output_tokens",
    "provider_amount",
    "provider_currency",
    "rate",
    "rate_currency",
    "rate_date",
    "rate_source",
    "amount",
    "currency",
    "note",
)


def job_receipts(job: Job, cost: dict) -> dict:
    """What the job page's receipts table shows, given the job's cost (`pricing.job_cost`): its first
    receipts, how many there are, their total and what has not settled yet."""
    charges = receipts.settled_charges(job.pk)
    shown = [receipts.receipt(charge, cost["currency"]) for charge in charges[:RECEIPTS_SHOWN]]
    count = len(shown) if len(shown) < RECEIPTS_SHOWN else charges.count()
    return {
        "rows": shown,
        "count": count,
        "more": count - len(shown),
        "total": cost["settled"],
        "currency": cost["currency"],
        "unsettled": receipts.unsettled(cost),
        "note": cost["rate_note"] if cost["price_known"] else cost["price_note"],
    }


def csv_lines(job: Job) -> Iterator[bytes]:
    currency = job_cost(job)["currency"]
    writer = csv.writer(Echo(), quoting=csv.QUOTE_ALL)
    yield (BYTE_ORDER_MARK + writer.writerow(CSV_COLUMNS)).encode()
    for charge in receipts.settled_charges(job.pk).iterator(chunk_size=CSV_BATCH):
        receipt = receipts.receipt(charge, currency)
        row = receipt.as_json() | {
            "settled_at": utc_text(receipt.settled_at),
            "rate_date": receipt.rate_date.isoformat() if receipt.rate_date else None,
        }
        yield writer.writerow(csv_values(tuple(row[column] for column in CSV_COLUMNS))).encode()


@require_GET
@login_required
@role_required(*VIEWERS)
def receipts_csv(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.only("pk", "reference", "provider", "model"), pk=job_id)
    return streamed_file(
        request,
        csv_lines(job),
        content_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": content_disposition_header(True, f"receipts-{file_name(job, 'csv')}"),
            "Cache-Control": "private, no-store",
        },
    )

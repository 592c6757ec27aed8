"""`GET /api/jobs/{id}/charges` (SPEC §6): a job's receipts, one settled unit a row, oldest settlement
first, a page at a time; `total` is the sum of every receipt's `amount` (all pages), in `currency`,
the currency of the job's cost, and `unsettled` what of the job's cost no receipt carries yet, so
`total` + `unsettled` is the job's `cost.total` exactly (`ledger.money.receipts`)."""

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.models import Job
from ledger.money import receipts
from ledger.money.pricing import job_cost

from ..permissions import VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import found_or_404
from .shapes import page_of

RECEIPTS_PER_PAGE = 100


@door(BEARER_TOKEN, GET=VIEWERS)
def charges(request: HttpRequest, job_id: int) -> HttpResponse:
    job = found_or_404(request, Job.objects.filter(pk=job_id), "No job")
    cost = job_cost(job)
    rows = receipts.settled_charges(job.pk)
    page = page_of(
        request,
        rows,
        RECEIPTS_PER_PAGE,
        lambda page: [receipts.receipt(charge, cost["currency"]).as_json() for charge in page],
        order=receipts.RECEIPT_ORDER,
        count=rows.count,
    )
    return JsonResponse(
        {
            **page,
            "total": cost["settled"],
            "currency": cost["currency"],
            "unsettled": receipts.unsettled(cost),
            "job_total": cost["total"],
            # Why the amounts are in USD (a unit settled with no rate), or why there are none.
            "note": cost["rate_note"] if cost["price_known"] else cost["price_note"],
        }
    )

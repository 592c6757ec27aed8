"""`GET /api/jobs/{id}/costs?by=FIELD` (SPEC §6): where a job's money went, by a product field (such as
`category`), the product's `title` or the item's `state`. What a group counts and how the job's cost is
split over the groups is ledger/money/cost_groups.py's.

A field that no product of the job has is no mistake (a catalogue's fields differ from product to
product): every item is then in the group whose `key` is null."""

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.models import Job
from ledger.money.cost_groups import (
    FIELD_NAME,
    FIELD_NAME_RULE,
    GroupCost,
    TooManyGroups,
    job_costs_by,
)

from ..permissions import VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import found_or_404, invalid


def group_json(group: GroupCost) -> dict:
    return {
        "key": group.key,
        "label": group.label,
        "items": group.items,
        "amount": group.amount,
        "approved": group.approved,
        "per_approved": group.per_approved,
        "wasted": group.wasted,
        "provider_currency": {
            "amount": group.provider_amount,
            "wasted": group.provider_wasted,
        },
    }


@door(BEARER_TOKEN, GET=VIEWERS)
def job_costs(request: HttpRequest, job_id: int) -> HttpResponse:
    job = found_or_404(request, Job.objects.filter(pk=job_id).only("pk", "provider", "model"), "No job")
    by = request.GET.get("by", "")
    if not FIELD_NAME.fullmatch(by):
        raise invalid({"by": f"{'missing' if not by else 'not a field name'}: {FIELD_NAME_RULE}"})
    try:
        cost, groups = job_costs_by(job, by)
    except TooManyGroups as too_many:
        raise invalid(
            {
                "by": f"{by} has more than {too_many.limit} values in this job: each item's cost is in "
                f"GET /api/jobs/{job.pk}/export"
            }
        ) from None
    return JsonResponse(
        {
            "currency": cost["currency"],
            "by": by,
            "total": cost["total"],
            "wasted": cost["wasted"],
            "price_note": cost["price_note"],
            "provider_currency": {
                "currency": cost["provider_currency"]["currency"],
                "total": cost["provider_currency"]["total"],
                "wasted": cost["provider_currency"]["wasted"],
            },
            "results": [group_json(group) for group in groups],
        }
    )

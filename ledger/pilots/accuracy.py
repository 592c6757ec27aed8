"""What followed a pilot's report (SPEC §6): the decision on it, and, once the full job's first pass
has settled, how the projection held: the first pass projected when the decision was made (its figures
as they stood) against the first pass paid for, in money and per cent. This is how BatchDesk measures
its own forecasts.

The first pass has settled when no item of the full job is still waiting for its first draft (prepared,
submitted or uncertain on its first attempt) and every unit of the full job has settled its charge.
The actual first pass: the first draft of every item of the full job and of the pilot (the scope's
products the full job left out were drafted once, in the pilot), priced at the job's price and
converted as the report converts (`Report.money`)."""

from decimal import Decimal

from django.db.models import Sum

from ..models import GeneratedVersion, Item, PilotDecision, UnitCharge
from ..money.currency import PLACES as MONEY_PLACES
from ..money.currency import PROVIDER_CURRENCY
from ..states import ItemState

PERCENT_PLACES = Decimal("0.1")
FIRST_ATTEMPT_WAITING = (ItemState.PREPARED, ItemState.SUBMITTED, ItemState.SUBMISSION_UNCERTAIN)


def decision_json(decision: PilotDecision | None) -> dict | None:
    """`{decision, by, at, note, full_job: {id, reference} | null}`; the API adds the full job's `url`."""
    if decision is None:
        return None
    full_job = decision.full_job
    return {
        "decision": decision.decision,
        "label": decision.get_decision_display(),
        "by": decision.by.get_username(),
        "at": decision.at,
        "note": decision.note,
        "arm": decision.pilot.arm,
        "full_job": {"id": full_job.pk, "reference": full_job.reference} if full_job else None,
        "full_job_plan": decision.figures.get("full_job"),
    }


def first_pass_waits_for(decision: PilotDecision) -> str | None:
    """What the full job's first pass still waits for, in words; None once it has settled."""
    job_id = decision.full_job_id
    drafting = Item.objects.filter(
        job_id=job_id, inference_attempt=1, state__in=FIRST_ATTEMPT_WAITING
    ).count()
    unsettled = UnitCharge.objects.filter(job_id=job_id, settled_at__isnull=True).count()
    if not drafting and not unsettled:
        return None
    waiting = []
    if drafting:
        waiting.append(f"{drafting:,} item{'s' if drafting != 1 else ''} still to get a first draft")
    if unsettled:
        waiting.append(f"{unsettled:,} unit{'s' if unsettled != 1 else ''} still to settle")
    return "Accuracy waits for the full job's first pass: " + " and ".join(waiting)


def accuracy(decision: PilotDecision | None, report) -> tuple[dict | None, str | None]:
    """(`{projected: {expected, low, high}, actual, error_percent, currency}` or None, a note saying
    what it waits for or why there is none). `report` is the pilot's `Report`."""
    if decision is None or decision.full_job_id is None:
        return None, None
    projected_cost = (decision.figures.get("projection") or {}).get("cost")
    if projected_cost is None or report.price is None:
        return None, "No accuracy: the model has no known price"
    if waits_for := first_pass_waits_for(decision):
        return None, waits_for
    tokens = GeneratedVersion.objects.filter(
        item__job_id__in=[decision.full_job_id, report.job.pk], number=1
    ).aggregate(input=Sum("input_tokens"), output=Sum("output_tokens"))
    actual_usd = report.price.cost(tokens["input"] or 0, tokens["output"] or 0)
    first_pass, currency = projected_cost["first_pass"], projected_cost["currency"]
    if currency == report.currency:
        actual = report.money(actual_usd)
    else:  # a rate came or went since the decision: compared in the provider's currency
        first_pass, currency = first_pass["provider"], PROVIDER_CURRENCY
        actual = actual_usd.quantize(MONEY_PLACES)
    projected = {end: Decimal(first_pass[end]) for end in ("expected", "low", "high")}
    error = None
    if projected["expected"]:
        error = float(
            (100 * (actual - projected["expected"]) / projected["expected"]).quantize(PERCENT_PLACES)
        )
    return {"projected": projected, "actual": actual, "error_percent": error, "currency": currency}, None

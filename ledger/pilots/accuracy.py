"""What followed a pilot's report (SPEC §6): the decision on it, and, once the full job's first pass
has settled, how the projection held: the first pass projected when the decision was made (its figures
as they stood) against the first pass paid for, in money and per cent. This is how BatchDesk measures
its own forecasts.

The first pass has settled when no item of the full job is still waiting for its first draft (prepared,
submitted or uncertain on its first attempt) and every unit of the full job has settled its charge.
Until then the report asks only whether one such item or unit exists; once settled, the figure is
computed once, kept on the decision (`PilotDecision.accuracy`) and read from there after: the full job
is not scanned again on every view.

The actual first pass counts one first draft per product of the scope, as the projection's does: the
first draft of every item of the full job, and the pilot's first drafts of the products the full job
left out (those whose pilot draft was approved: drafted once, in the pilot). A pilot product drafted
again in the full job counts once, in the full job. It is priced as the projection was expressed:
tokens at the job's batch price (`Price.cost`, as `ledger.pilots.measure` prices the pilot the
projection comes from), converted at the rate the projection was converted at (the decision's
`figures.rate`, with `convert`, as `Report.money` converts), or in USD when the projection was. So the
error measures the forecast (drafts and tokens), not the exchange rate's drift since the decision;
what was paid, at the rates the units settled at, is on the full job's receipts."""

import json
from datetime import date
from decimal import Decimal

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Exists, OuterRef, Sum
from django.utils import timezone

from ..models import GeneratedVersion, Item, PilotDecision, UnitCharge
from ..money.currency import PLACES as MONEY_PLACES
from ..money.currency import PROVIDER_CURRENCY, Rate, convert
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
    """What the full job's first pass still waits for, in words; None once it has settled. Two EXISTS
    queries: a million-item full job is not counted on every view."""
    job_id = decision.full_job_id
    waiting = []
    if Item.objects.filter(job_id=job_id, inference_attempt=1, state__in=FIRST_ATTEMPT_WAITING).exists():
        waiting.append("items still to get a first draft")
    if UnitCharge.objects.filter(job_id=job_id, settled_at__isnull=True).exists():
        waiting.append("units still to settle")
    if not waiting:
        return None
    return "Accuracy waits for the full job's first pass: " + " and ".join(waiting)


def first_pass_tokens(decision: PilotDecision) -> dict:
    """The input and output tokens of the actual first pass (module docstring): the full job's first
    drafts, and the pilot's first drafts of the products the full job left out."""
    full_job_id, pilot_job_id = decision.full_job_id, decision.pilot.job_id
    in_full_job = Item.objects.filter(job_id=full_job_id, product_id=OuterRef("item__product_id"))
    full = GeneratedVersion.objects.filter(item__job_id=full_job_id, number=1)
    left_out = GeneratedVersion.objects.filter(item__job_id=pilot_job_id, number=1).exclude(
        Exists(in_full_job)
    )
    sums = {"input": Sum("input_tokens", default=0), "output": Sum("output_tokens", default=0)}
    full, left_out = full.aggregate(**sums), left_out.aggregate(**sums)
    return {end: full[end] + left_out[end] for end in ("input", "output")}


def measure_accuracy(decision: PilotDecision, price) -> dict:
    """How the projection held (module docstring), amounts as exact decimals."""
    first_pass = decision.figures["projection"]["cost"]["first_pass"]
    currency, rate = first_pass["currency"], decision.figures.get("rate")
    tokens = first_pass_tokens(decision)
    actual_usd = price.cost(tokens["input"], tokens["output"])
    if currency != PROVIDER_CURRENCY and rate:
        actual = convert(
            actual_usd, Rate(Decimal(rate["per_usd"]), date.fromisoformat(rate["date"]), rate["source"])
        )
    else:  # the projection was in USD (no rate in force when decided)
        first_pass, currency = first_pass.get("provider", first_pass), PROVIDER_CURRENCY
        actual = actual_usd.quantize(MONEY_PLACES)
    projected = {end: Decimal(first_pass[end]) for end in ("expected", "low", "high")}
    error = None
    if projected["expected"]:
        error = float(
            (100 * (actual - projected["expected"]) / projected["expected"]).quantize(PERCENT_PLACES)
        )
    return {"projected": projected, "actual": actual, "error_percent": error, "currency": currency}


def stored(figure: dict) -> dict:
    """The accuracy as kept on the decision (JSON: amounts as text), with its amounts as decimals again."""
    return {
        **figure,
        "projected": {end: Decimal(amount) for end, amount in figure["projected"].items()},
        "actual": Decimal(figure["actual"]),
    }


def accuracy(decision: PilotDecision | None, report) -> tuple[dict | None, str | None]:
    """(`{projected: {expected, low, high}, actual, error_percent, currency}` or None, a note saying
    what it waits for or why there is none). `report` is the pilot's `Report`. Computed once, when the
    first pass has settled, and kept on the decision."""
    if decision is None or decision.full_job_id is None:
        return None, None
    if decision.accuracy is not None:
        return stored(decision.accuracy), None
    if (decision.figures.get("projection") or {}).get("cost") is None or report.price is None:
        return None, "No accuracy: the model has no known price"
    if waits_for := first_pass_waits_for(decision):
        return None, waits_for
    measured = measure_accuracy(decision, report.price)
    kept = json.loads(json.dumps(measured, cls=DjangoJSONEncoder))
    # Kept once: two views at once may both measure, and the first to keep it wins.
    PilotDecision.objects.filter(pk=decision.pk, accuracy__isnull=True).update(
        accuracy=kept, accuracy_at=timezone.now()
    )
    return stored(PilotDecision.objects.values_list("accuracy", flat=True).get(pk=decision.pk)), None

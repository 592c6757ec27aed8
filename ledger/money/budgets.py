"""Budgets that hold (rule 18) and what each unit costs (SPEC §9).

Before a unit is sent, its worst case is reserved: every request's input at most one token per
byte of what is sent (no tokenizer makes more tokens than bytes), plus its `max_tokens` of output,
at the batch price, in the business currency at today's rate (`UnitCharge`). A unit that would take
a job's spend and holds past its budget is not sent: the job is paused (`budget_reached`) with what
it would take to go on (`actions.budgeting.reserve`). The job's row is locked while it is checked and
reserved, so two clusters sending units of one job at once never pass the budget together. When the unit's results are
recorded (or it ends without running) the usage its drafts carry settles the reservation, priced
and converted then, and kept with the rate, its date and its source.
"""

import json
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from django.db import connection
from django.db.models import Case, DecimalField, F, Sum, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..models import GeneratedVersion, Job, Submission, SubmissionItem, UnitCharge
from .currency import PROVIDER_CURRENCY, business_currency, convert, rate_now, rate_on
from .pricing import PLACES, price_for, unknown_price

# Tokens a provider adds around each request's messages (roles, the chat template).
REQUEST_OVERHEAD_TOKENS = 16
CENT = Decimal("0.01")


@dataclass(frozen=True)
class WorstCase:
    input_tokens: int
    output_tokens: int


def worst_case(requests) -> WorstCase:
    """The most tokens `requests` can be billed for."""
    input_tokens = output_tokens = 0
    schema_bytes: dict[int, int] = {}  # a unit's requests share their prompt's schema: sized once
    for request in requests:
        schema = request.output_schema
        if id(schema) not in schema_bytes:
            schema_bytes[id(schema)] = len(json.dumps(schema, ensure_ascii=False).encode()) if schema else 0
        input_tokens += (
            REQUEST_OVERHEAD_TOKENS
            + len(request.system_message.encode())
            + len(request.user_message.encode())
            + schema_bytes[id(schema)]
        )
        output_tokens += request.max_output_tokens
    return WorstCase(input_tokens, output_tokens)


def budget_problem(budget: Decimal, provider: str, model: str) -> str | None:
    """Why a job of `provider`/`model` cannot be held to `budget`, or None."""
    if not budget.is_finite() or budget <= 0:
        return "A budget is an amount above 0"
    if price_for(provider, model) is None:
        return f"A budget cannot be held without a price: {unknown_price(provider, model)}"
    if rate_now() is None:
        return (
            f"A budget in {business_currency()} cannot be held without a rate from USD: set "
            "BATCHDESK_FX_FILE or have an admin enter a rate"
        )
    return None


# What a unit counts for against its job's budget: its cost once settled, its reservation before.
SPENT_OR_HELD = Sum(
    Case(
        When(settled_at__isnull=False, then=Coalesce(F("cost"), F("reserved"), Decimal(0))),
        default=Coalesce(F("reserved"), Decimal(0)),
        output_field=DecimalField(max_digits=20, decimal_places=6),
    )
)


def committed(job_id: int, *, excluding_submission: int | None = None) -> Decimal:
    """The job's spend so far and what its units in flight hold, in the business currency: each
    settled unit at its cost, each other at its reservation."""
    charges = UnitCharge.objects.filter(job_id=job_id)
    if excluding_submission is not None:
        charges = charges.exclude(submission_id=excluding_submission)
    return charges.aggregate(total=SPENT_OR_HELD)["total"] or Decimal(0)


def committed_by_job(job_ids: list[int]) -> dict[int, Decimal]:
    """`committed` for many jobs in one query (a page or an API list of jobs)."""
    rows = (
        UnitCharge.objects.filter(job_id__in=job_ids)
        .order_by()
        .values_list("job_id")
        .annotate(total=SPENT_OR_HELD)
    )
    return {job_id: Decimal(0) for job_id in job_ids} | {job_id: total for job_id, total in rows}


@dataclass(frozen=True)
class UnitHold:
    """What holding a unit against its job's budget takes: its worst case in USD at the batch price,
    and in the business currency at today's rate (None without a price or a rate), and why it does
    not fit the job's budget (None when it fits, or the job has none)."""

    worst_usd: Decimal | None
    worst: Decimal | None
    problem: str | None


def unit_hold(job: Job, submission: Submission, requests) -> UnitHold:
    """The hold `requests`, the unit `submission` of `job`, would take. Read with the job's row locked:
    what its other units spent or hold is part of the answer."""
    price = price_for(job.provider, job.model)
    rate = rate_now()
    tokens = worst_case(requests)
    worst_usd = price.cost(tokens.input_tokens, tokens.output_tokens).quantize(PLACES) if price else None
    worst = convert(worst_usd, rate) if worst_usd is not None else None
    problem = None
    if job.budget is not None:
        if worst_usd is None:
            problem = f"No unit can be held to the budget: {unknown_price(job.provider, job.model)}"
        elif job.budget_currency != business_currency():
            problem = (
                f"The budget is in {job.budget_currency} and costs are now kept in "
                f"{business_currency()}: set the budget again"
            )
        elif worst is None:
            problem = (
                f"No unit can be held to the budget: no rate from USD to {business_currency()} is in force"
            )
        else:
            held = committed(job.pk, excluding_submission=submission.pk)
            if held + worst > job.budget:
                short = (held + worst - job.budget).quantize(CENT, rounding=ROUND_CEILING)
                problem = (
                    f"The next unit ({len(requests):,} requests) could cost up to "
                    f"{worst.quantize(CENT, rounding=ROUND_CEILING)} {job.budget_currency}; "
                    f"{held.quantize(CENT, rounding=ROUND_CEILING)} is spent or held of the "
                    f"{job.budget} budget. Raise it by at least {short} {job.budget_currency} to go on"
                )
    return UnitHold(worst_usd, worst, problem)


def hold(submission: Submission, job: Job, requests: int, unit: UnitHold) -> None:
    """Keep the unit's hold (`unit_hold`) as its charge; a unit sent again keeps its one charge."""
    UnitCharge.objects.update_or_create(
        submission=submission,
        defaults={
            "job": job,
            "requests": requests,
            "currency": business_currency(),
            "reserved_usd": unit.worst_usd if unit.worst_usd is not None else Decimal(0),
            "reserved": unit.worst,
            "reserved_at": timezone.now(),
        },
    )


def settle(submission: Submission) -> None:
    """Price the usage the unit's drafts carry, at the rate in force today, and keep it; a unit that
    ran nothing settles at nothing. Called as the unit reaches its end (collected or failed)."""
    charge = UnitCharge.objects.filter(submission=submission).first()
    if charge is None or charge.settled_at is not None:
        return
    input_tokens, output_tokens = unit_usage(submission.pk)
    price = price_for(submission.provider, submission.model)
    cost_usd = price.cost(input_tokens, output_tokens).quantize(PLACES) if price else None
    today = timezone.localdate()
    rate = rate_on(today)
    UnitCharge.objects.filter(pk=charge.pk, settled_at__isnull=True).update(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost_usd,
        cost=convert(cost_usd, rate) if cost_usd is not None else None,
        rate=rate.per_usd if rate else None,
        rate_date=rate.valid_from if rate and rate.valid_from.year > 1 else (today if rate else None),
        rate_source=rate.source if rate else "",
        settled_at=timezone.now(),
    )


def unit_usage(submission_id: int) -> tuple[int, int]:
    """Tokens of the drafts the unit returned, found through its entries (versions are not indexed
    by their submission): one probe per request."""
    versions = GeneratedVersion._meta.db_table
    entries = SubmissionItem._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COALESCE(SUM(v.input_tokens), 0), COALESCE(SUM(v.output_tokens), 0) "
            f"FROM {entries} e JOIN {versions} v ON v.item_id = e.item_id AND v.custom_id = e.custom_id "
            f"WHERE e.submission_id = %s AND v.submission_id = %s",
            [submission_id, submission_id],
        )
        input_tokens, output_tokens = cursor.fetchone()
    return int(input_tokens), int(output_tokens)


def settled_spend_by_currency() -> dict[str, Decimal]:
    """Settled spend: every settled unit's charge, summed by the currency it was kept in: the business
    currency (at the rate of its day), or USD for a unit settled with no rate in force. Not the draft
    spend (`pricing.draft_spend`), which prices every draft as it arrives, settled or not."""
    settled = UnitCharge.objects.filter(settled_at__isnull=False, cost_usd__isnull=False).order_by()
    converted = settled.filter(cost__isnull=False).values_list("currency").annotate(total=Sum("cost"))
    charged = {currency: total for currency, total in converted}
    unconverted = settled.filter(cost__isnull=True).aggregate(total=Sum("cost_usd"))["total"]
    if unconverted:
        charged[PROVIDER_CURRENCY] = charged.get(PROVIDER_CURRENCY, Decimal(0)) + unconverted
    return {currency: Decimal(total).quantize(PLACES) for currency, total in charged.items()}

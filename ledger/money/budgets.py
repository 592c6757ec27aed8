"""Budgets that hold (rule 18) and what each unit costs (SPEC §9).

Before a unit is sent, its worst case is reserved: every request's input at most one token per
byte of what is sent (no tokenizer makes more tokens than bytes), plus its `max_tokens` of output,
at the batch price, in the business currency at today's rate and a margin for its rise before
the unit settles (`UnitCharge`). A job with a budget
sends its requests with `max_tokens` lowered to the largest output measured for its prompt version
and model (`actions.requests.output_cap`), so that what is held stays close to what units cost.
Of a unit that would take a job's spend and holds past its budget, only the head that fits is held
and sent; when not even one request fits, the job is paused (`budget_reached`)
(`actions.budgeting.reserve`). The job's
row is locked while it is checked and reserved, so two clusters sending units of one job at once
never pass the budget together. When the unit's results are recorded (or it ends without running)
the usage its drafts carry settles the reservation, priced and converted then, and kept with the
rate, its date and its source. `figures` are what a job has spent, holds and has left, now.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, Decimal

from django.db import connection
from django.db.models import Case, Count, DecimalField, F, Q, Sum, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..models import GeneratedVersion, Job, Submission, SubmissionItem, UnitCharge
from .currency import PROVIDER_CURRENCY, Rate, business_currency, convert, rate_now, rate_on
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
    for tokens in worst_cases(requests):
        input_tokens += tokens.input_tokens
        output_tokens += tokens.output_tokens
    return WorstCase(input_tokens, output_tokens)


def worst_cases(requests):
    """The most tokens each of `requests` can be billed for, in their order."""
    schema_bytes: dict[int, int] = {}  # a unit's requests share their prompt's schema: sized once
    for request in requests:
        schema = request.output_schema
        if id(schema) not in schema_bytes:
            schema_bytes[id(schema)] = len(json.dumps(schema, ensure_ascii=False).encode()) if schema else 0
        yield WorstCase(
            REQUEST_OVERHEAD_TOKENS
            + len(request.system_message.encode())
            + len(request.user_message.encode())
            + schema_bytes[id(schema)],
            request.max_output_tokens,
        )


# A unit is held at today's rate and settles at the rate of the day it settles, a day or so later
# (a batch may run 24 hours): a rise between would take the job past its budget. So it is held at
# the rate 2 % higher, more than a major currency's daily rate against the dollar moves in a day
# but in a crisis. Not held where the business currency is the provider's (nothing converts).
RATE_RISE_MARGIN = Decimal("0.02")


def holding_rate() -> Rate | None:
    """The rate a unit is held at: today's, with the margin for a rise before it settles."""
    rate = rate_now()
    if rate is None or business_currency() == PROVIDER_CURRENCY:
        return rate
    return replace(rate, per_usd=rate.per_usd * (1 + RATE_RISE_MARGIN))


# SPEC §9: a budget is an amount of the business currency a person can pay.
BUDGET_RULE = "A budget has at most two decimal places and is at least 0.01"


def budget_amount_problem(budget: Decimal) -> str | None:
    """BUDGET_RULE when `budget` breaks it, or None."""
    # Read by its exponent, not quantized: an amount too large to quantize is refused by its size.
    if not budget.is_finite() or budget < CENT or budget.normalize().as_tuple().exponent < -2:
        return BUDGET_RULE
    return None


def budget_problem(budget: Decimal, provider: str, model: str) -> str | None:
    """Why a job of `provider`/`model` cannot be held to `budget`, or None."""
    if problem := budget_amount_problem(budget):
        return problem
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


@dataclass(frozen=True)
class UnitHold:
    """What holding a unit against its job's budget takes: how many of its requests, from the first,
    are held (all of them for a job without a budget; fewer when only a head of the unit fits what is
    left), their worst case in USD at the batch price and in the business currency at today's rate
    (None without a price or a rate), and why not even one request fits the job's budget (None when
    some fit, or the job has none)."""

    requests: int
    worst_usd: Decimal | None
    worst: Decimal | None
    problem: str | None


def unit_hold(job: Job, submission: Submission, requests) -> UnitHold:
    """The hold of the longest head of `requests`, the unit `submission` of `job`, that fits what is
    left of the job's budget. Read with the job's row locked: what its other units spent or hold is
    part of the answer."""
    price = price_for(job.provider, job.model)
    rate = holding_rate()
    if job.budget is None:
        tokens = worst_case(requests)
        worst_usd = price.cost(tokens.input_tokens, tokens.output_tokens).quantize(PLACES) if price else None
        return UnitHold(
            len(requests), worst_usd, convert(worst_usd, rate) if worst_usd is not None else None, None
        )
    if price is None:
        return UnitHold(
            0, None, None, f"No unit can be held to the budget: {unknown_price(job.provider, job.model)}"
        )
    if job.budget_currency != business_currency():
        return UnitHold(
            0,
            None,
            None,
            f"The budget is in {job.budget_currency} and costs are now kept in "
            f"{business_currency()}: set the budget again",
        )
    if rate is None:
        return UnitHold(
            0,
            None,
            None,
            f"No unit can be held to the budget: no rate from USD to {business_currency()} is in force",
        )
    held = committed(job.pk, excluding_submission=submission.pk)
    left = job.budget - held
    fitting, fitting_usd, fitting_worst = 0, Decimal(0), Decimal(0)
    input_tokens = output_tokens = 0
    for tokens in worst_cases(requests):
        input_tokens += tokens.input_tokens
        output_tokens += tokens.output_tokens
        worst_usd = price.cost(input_tokens, output_tokens).quantize(PLACES)
        worst = convert(worst_usd, rate)
        if worst > left:
            if not fitting:
                short = (worst - left).quantize(CENT, rounding=ROUND_CEILING)
                problem = (
                    f"The next request could cost up to {worst} {job.budget_currency}; {held} is spent "
                    f"or held of the {job.budget} budget. Raise it by at least {short} "
                    f"{job.budget_currency} to go on"
                )
                return UnitHold(0, None, None, problem)
            break
        fitting, fitting_usd, fitting_worst = fitting + 1, worst_usd, worst
    return UnitHold(fitting, fitting_usd, fitting_worst, None)


def requests_need(job: Job, requests) -> Decimal | None:
    """What `requests` of `job` hold at worst, in the business currency at today's rate (None
    without a price or a rate)."""
    price = price_for(job.provider, job.model)
    rate = holding_rate()
    if price is None or rate is None:
        return None
    tokens = worst_case(requests)
    return convert(price.cost(tokens.input_tokens, tokens.output_tokens).quantize(PLACES), rate)


def in_flight(job_id: int, *, excluding_submission: int | None = None) -> bool:
    """Whether a unit of the job holds part of its budget and has not settled yet."""
    charges = UnitCharge.objects.filter(job_id=job_id, settled_at__isnull=True)
    if excluding_submission is not None:
        charges = charges.exclude(submission_id=excluding_submission)
    return charges.exists()


@dataclass(frozen=True)
class BudgetFigures:
    """A job's budget as it stands now, in its currency: spent (its settled units' costs), held (the
    reservations of its units in flight, `in_flight` of them), left, and what its next request needs
    (None when nothing waits to be sent, or it cannot be priced)."""

    budget: Decimal
    currency: str
    spent: Decimal
    held: Decimal
    in_flight: int
    next_needs: Decimal | None

    @property
    def spent_or_held(self) -> Decimal:
        return self.spent + self.held

    @property
    def left(self) -> Decimal:
        return max(self.budget - self.spent_or_held, Decimal(0))

    @property
    def next_fits(self) -> bool:
        return self.next_needs is not None and self.next_needs <= self.left

    def waiting_for(self, show: Callable[[Decimal], str] | None = None) -> str:
        """What a job its budget paused waits for, in these figures; amounts written by `show`
        (a screen's money), else as exact decimals with the currency."""
        show = show or (lambda amount: f"{amount} {self.currency}")
        if self.next_needs is None:
            return f"{show(self.spent_or_held)} is spent or held of the {show(self.budget)} budget; {show(self.left)} is left"
        needs = f"the next request needs up to {show(self.next_needs)}, {show(self.left)} is left"
        if self.next_fits:
            return f"Ready to go on: {needs}"
        units = f"{self.in_flight} unit{'s' if self.in_flight != 1 else ''}"
        if self.in_flight:
            return (
                f"Waiting for {units} in flight to settle: {show(self.held)} held; {needs}. It goes on "
                f"by itself once enough is freed, or raise the budget by at least {show(self.short)}"
            )
        return (
            f"Nothing in flight will free any of the budget: {show(self.spent)} spent; {needs}. Raise "
            f"the budget by at least {show(self.short)} to go on"
        )

    @property
    def short(self) -> Decimal:
        """What the budget must be raised by, at least, for the next request to fit as things stand
        (nothing of what is held coming back)."""
        if self.next_needs is None or self.next_fits:
            return Decimal(0)
        return (self.next_needs - self.left).quantize(CENT, rounding=ROUND_CEILING)


SPENT = Sum(Coalesce(F("cost"), F("reserved"), Decimal(0)), filter=Q(settled_at__isnull=False))
HELD = Sum(Coalesce(F("reserved"), Decimal(0)), filter=Q(settled_at__isnull=True))


def figures(job: Job, *, next_needs: Decimal | None = None) -> BudgetFigures | None:
    """The job's budget as it stands now (one query), or None without a budget. `next_needs`: what
    its next request needs (`actions.budgeting.next_request_need`)."""
    return figures_by_job([job], next_needs={job.pk: next_needs}).get(job.pk)


def figures_by_job(
    jobs: list[Job], *, next_needs: dict[int, Decimal | None] | None = None
) -> dict[int, BudgetFigures]:
    """`figures` of each of `jobs` that has a budget, in one query (a page or an API list of jobs)."""
    budgeted = {job.pk: job for job in jobs if job.budget is not None}
    if not budgeted:
        return {}
    rows = {
        job_id: (spent, held, in_flight)
        for job_id, spent, held, in_flight in UnitCharge.objects.filter(job_id__in=list(budgeted))
        .order_by()
        .values("job_id")
        .annotate(spent=SPENT, held=HELD, in_flight=Count("id", filter=Q(settled_at__isnull=True)))
        .values_list("job_id", "spent", "held", "in_flight")
    }
    shown = {}
    for job_id, job in budgeted.items():
        spent, held, in_flight = rows.get(job_id, (None, None, 0))
        shown[job_id] = BudgetFigures(
            budget=job.budget,
            currency=job.budget_currency,
            # At the ledger's own precision (a millionth), never rounded to the penny.
            spent=(spent or Decimal(0)).quantize(PLACES),
            held=(held or Decimal(0)).quantize(PLACES),
            in_flight=in_flight,
            next_needs=(next_needs or {}).get(job_id),
        )
    return shown


def hold(submission: Submission, job: Job, unit: UnitHold) -> None:
    """Keep the unit's hold (`unit_hold`) as its charge; a unit sent again keeps its one charge."""
    UnitCharge.objects.update_or_create(
        submission=submission,
        defaults={
            "job": job,
            "requests": unit.requests,
            "currency": business_currency(),
            "reserved_usd": unit.worst_usd if unit.worst_usd is not None else Decimal(0),
            "reserved": unit.worst,
            "reserved_at": timezone.now(),
        },
    )


def settle(submission: Submission) -> UnitCharge | None:
    """Price the usage the unit's drafts carry, at the rate in force today, and keep it; a unit that
    ran nothing settles at nothing. Called as the unit reaches its end (collected or failed). Returns
    the charge settled, read with its job (None when there was none to settle)."""
    charge = UnitCharge.objects.select_related("job__prompt_version").filter(submission=submission).first()
    if charge is None or charge.settled_at is not None:
        return None
    input_tokens, output_tokens, largest_output = unit_usage(submission.pk)
    price = price_for(submission.provider, submission.model)
    cost_usd = price.cost(input_tokens, output_tokens).quantize(PLACES) if price else None
    today = timezone.localdate()
    rate = rate_on(today)
    settled = UnitCharge.objects.filter(pk=charge.pk, settled_at__isnull=True).update(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        largest_output=largest_output,
        cost_usd=cost_usd,
        cost=convert(cost_usd, rate) if cost_usd is not None else None,
        rate=rate.per_usd if rate else None,
        rate_date=rate.valid_from if rate and rate.valid_from.year > 1 else (today if rate else None),
        rate_source=rate.source if rate else "",
        settled_at=timezone.now(),
    )
    return charge if settled else None


def unit_usage(submission_id: int) -> tuple[int, int, int | None]:
    """Tokens of the drafts the unit returned, found through its entries (versions are not indexed
    by their submission): one probe per request. In all, in and out, and the longest answer's (None
    when no draft returned)."""
    versions = GeneratedVersion._meta.db_table
    entries = SubmissionItem._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COALESCE(SUM(v.input_tokens), 0), COALESCE(SUM(v.output_tokens), 0), "
            f"MAX(v.output_tokens) "
            f"FROM {entries} e JOIN {versions} v ON v.item_id = e.item_id AND v.custom_id = e.custom_id "
            f"WHERE e.submission_id = %s AND v.submission_id = %s",
            [submission_id, submission_id],
        )
        input_tokens, output_tokens, largest = cursor.fetchone()
    return int(input_tokens), int(output_tokens), largest


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

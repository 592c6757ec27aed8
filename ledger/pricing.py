"""What drafts cost (SPEC §9): a price table per provider and model, and cost sums over versions.

Costs are summed in the database: a job's token counts are added up per partition (approved,
pending, all) in one aggregate query and priced afterwards, since one job has one provider and
one model. Amounts are USD, as `Decimal`.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Sum

from .models import GeneratedVersion, Item
from .states import ItemState

MILLION = Decimal(1_000_000)
# Provider batch APIs charge half the interactive price.
BATCH_DISCOUNT = Decimal("0.5")
PLACES = Decimal("0.000001")


@dataclass(frozen=True)
class Price:
    """List prices in USD per million tokens, before the batch discount."""

    input_per_million: Decimal
    output_per_million: Decimal
    batch_discount: Decimal = BATCH_DISCOUNT

    def cost(self, input_tokens: int, output_tokens: int) -> Decimal:
        gross = (input_tokens * self.input_per_million + output_tokens * self.output_per_million) / MILLION
        return gross * self.batch_discount


def _price(input_per_million: str, output_per_million: str) -> Price:
    return Price(Decimal(input_per_million), Decimal(output_per_million))


PRICES: dict[str, dict[str, Price]] = {
    "openai": {
        "gpt-4o-mini": _price("0.15", "0.60"),
        "gpt-4o": _price("2.50", "10.00"),
        "gpt-4.1-nano": _price("0.10", "0.40"),
        "gpt-4.1-mini": _price("0.40", "1.60"),
        "gpt-4.1": _price("2.00", "8.00"),
    },
    "anthropic": {
        "claude-3-5-haiku": _price("0.80", "4.00"),
        "claude-sonnet-4": _price("3.00", "15.00"),
    },
}
# The emulator speaks OpenAI's batch API and is priced like the model it names, so a demo shows
# what the same work would cost for real.
PRICED_LIKE = {"emulator": "openai"}
# A model missing from the table is priced like the cheapest common one rather than as free:
# spend that is underestimated is less misleading than spend that is not shown at all.
FALLBACK = PRICES["openai"]["gpt-4o-mini"]


def price_for(provider: str, model: str) -> Price:
    """The price of `model` at `provider`; dated names (`gpt-4o-mini-2024-07-18`) match their model."""
    table = PRICES.get(PRICED_LIKE.get(provider, provider), {})
    if model in table:
        return table[model]
    prefixes = [name for name in table if model.startswith(name + "-")]
    return table[max(prefixes, key=len)] if prefixes else FALLBACK


def version_cost(version: GeneratedVersion) -> Decimal:
    job = version.item.job
    return (
        price_for(job.provider, job.model).cost(version.input_tokens, version.output_tokens).quantize(PLACES)
    )


# --- sums over many versions ---------------------------------------------------------------

# A draft of an item in these states will never be published, whatever was decided about it.
DISCARDED_STATES = (ItemState.OBSOLETE, ItemState.WITHDRAWN, ItemState.CANCELLED)
# The latest draft of an item in these states is still waiting for a decision.
UNDECIDED_STATES = (ItemState.RETURNED, ItemState.AWAITING_REVIEW)

# Approved: the version the item's approval names, unless the product moved on or went away.
APPROVED = Q(item__approved_version=F("pk")) & ~Q(item__state__in=DISCARDED_STATES)
# Pending: the latest draft of an item that is still to be decided on.
PENDING = Q(item__state__in=UNDECIDED_STATES) & ~Exists(
    GeneratedVersion.objects.filter(item=OuterRef("item"), number__gt=OuterRef("number"))
)
# Everything else is wasted: rejected, invalid, obsolete or withdrawn drafts, and drafts that a
# retry replaced.


def _token_sums_by_job(versions: QuerySet[GeneratedVersion]) -> QuerySet:
    return (
        versions.order_by()
        .values("item__job_id", "item__job__provider", "item__job__model")
        .annotate(
            all_input=Sum("input_tokens"),
            all_output=Sum("output_tokens"),
            approved_input=Sum("input_tokens", filter=APPROVED),
            approved_output=Sum("output_tokens", filter=APPROVED),
            approved_drafts=Count("pk", filter=APPROVED),
            pending_input=Sum("input_tokens", filter=PENDING),
            pending_output=Sum("output_tokens", filter=PENDING),
        )
    )


def _divide(amount: Decimal, count: int) -> Decimal | None:
    return (amount / count).quantize(PLACES) if count else None


def jobs_cost(job_ids: Iterable[int]) -> dict[int, dict]:
    """`job_cost` for many jobs at once: two aggregate queries whatever their size."""
    job_ids = list(job_ids)
    item_counts = dict(
        Item.objects.filter(job_id__in=job_ids).order_by().values_list("job_id").annotate(n=Count("pk"))
    )
    rows = {
        row["item__job_id"]: row
        for row in _token_sums_by_job(GeneratedVersion.objects.filter(item__job_id__in=job_ids))
    }
    costs = {}
    for job_id in job_ids:
        row = rows.get(job_id)
        if row is None:
            total = approved = pending = Decimal(0)
            input_tokens = output_tokens = approved_drafts = 0
        else:
            price = price_for(row["item__job__provider"], row["item__job__model"])
            input_tokens, output_tokens = row["all_input"], row["all_output"]
            approved_drafts = row["approved_drafts"]
            total = price.cost(input_tokens, output_tokens)
            approved = price.cost(row["approved_input"] or 0, row["approved_output"] or 0)
            pending = price.cost(row["pending_input"] or 0, row["pending_output"] or 0)
        costs[job_id] = {
            "currency": "USD",
            "total": total.quantize(PLACES),
            "approved": approved.quantize(PLACES),
            "pending": pending.quantize(PLACES),
            "wasted": (total - approved - pending).quantize(PLACES),
            "per_item": _divide(total, item_counts.get(job_id, 0)),
            "per_approved_draft": _divide(total, approved_drafts),
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
        }
    return costs


def job_cost(job) -> dict:
    """What a job's drafts cost: `total` = `approved` + `pending` (drafts still to be decided on)
    + `wasted` (rejected, invalid, obsolete, withdrawn, or replaced by a retry). `per_approved_draft`
    is the whole spend divided by the drafts approved, so waste raises it."""
    return jobs_cost([job.pk])[job.pk]


def total_spend() -> Decimal:
    """Everything spent on drafts so far, across all jobs: one query grouped by provider and model."""
    rows = (
        GeneratedVersion.objects.order_by()
        .values("item__job__provider", "item__job__model")
        .annotate(all_input=Sum("input_tokens"), all_output=Sum("output_tokens"))
    )
    spend = sum(
        (
            price_for(row["item__job__provider"], row["item__job__model"]).cost(
                row["all_input"], row["all_output"]
            )
            for row in rows
        ),
        Decimal(0),
    )
    return spend.quantize(PLACES)

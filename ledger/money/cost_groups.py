"""Cost where it is spent (SPEC §6 `GET /api/jobs/{id}/costs?by=FIELD`, §8 `/quality/`): a job's cost
split over groups of its items, by a product field (`category`, any field of the revision the item was
made from), the product's `title`, or the item's `state`.

A group's tokens are counted as the job's tallies count them (`pricing.TALLY_SUMS`): every draft of
its items, the approved draft of each item whose approval may still be published, and the latest
draft of each item still waiting for a decision; what is neither approved nor pending is wasted. The
groups come from one grouped query over the items and their drafts, whatever the job's size. The job's
cost as `pricing.job_cost` gives it (`total` and `wasted`, in the business currency and in USD) is
then split over the groups in proportion to each group's drafts at the job's price, with
`split_exactly`, so the groups add up to the job's figures to the last digit."""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from django.db import models
from django.db.models import Count, Exists, F, OuterRef, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from ..models import GeneratedVersion, Item, ItemTally, Job
from ..states import DISCARDED_STATES
from .apportion import split_exactly
from .pricing import PLACES, UNDECIDED_STATES, Price, job_cost, jobs_cost, price_for

# What a cost can be grouped by besides a product field: the product's title, the item's state (a
# product field named `title` or `state` is shadowed by these).
TITLE, STATE = "title", "state"
# A product field's name as it may be asked for: letters, digits, `_` and `-`, at most 64.
FIELD_NAME = re.compile(r"[\w-]{1,64}")
FIELD_NAME_RULE = "a product field's name (letters, digits, _ and -, at most 64), title or state"
# The label of the group of items whose product has no value for the field.
NO_VALUE = "(none)"
# More groups than this is a field with a value per product: each item's cost is in the job's export.
MAX_GROUPS = 1000


class TooManyGroups(Exception):
    """The field has more values among the items than `limit`."""

    def __init__(self, by: str, limit: int):
        super().__init__(f"{by} has more than {limit} values among these items")
        self.limit = limit


def group_key(by: str) -> models.Expression:
    """The value each item is grouped under: the item's state, its product's title, or the field `by`
    of the revision it was made from, as text (a number, a list or an object as its JSON); NULL when
    the revision has no such field or it is null."""
    if by == STATE:
        return F("state")
    if by == TITLE:
        return F("source_revision__title")
    return Cast(KeyTextTransform(by, "source_revision__fields"), output_field=models.TextField())


# A draft of the item (joined as `versions`) counted as its approved draft, and as the draft still to
# be decided on: the item's latest, while it waits for a decision.
APPROVED_DRAFT = Q(versions__id=F("approved_version_id")) & ~Q(state__in=DISCARDED_STATES)
PENDING_DRAFT = Q(state__in=UNDECIDED_STATES) & ~Q(
    Exists(GeneratedVersion.objects.filter(item_id=OuterRef("pk"), number__gt=OuterRef("versions__number")))
)
GROUP_SUMS = {
    "items": Count("pk", distinct=True),
    "approved_drafts": Count("versions", filter=APPROVED_DRAFT),
    "all_input": Sum("versions__input_tokens", default=0),
    "all_output": Sum("versions__output_tokens", default=0),
    "approved_input": Sum("versions__input_tokens", filter=APPROVED_DRAFT, default=0),
    "approved_output": Sum("versions__output_tokens", filter=APPROVED_DRAFT, default=0),
    "pending_input": Sum("versions__input_tokens", filter=PENDING_DRAFT, default=0),
    "pending_output": Sum("versions__output_tokens", filter=PENDING_DRAFT, default=0),
}


def grouped_tokens(jobs: Iterable[int] | models.QuerySet, by: str, *, limit: int | None = None) -> list[dict]:
    """One row per job and group: `job_id`, `key` and `GROUP_SUMS`, from one grouped query over the
    items of `jobs` (ids, or a query of them). TooManyGroups when there are more than `limit` rows
    (`MAX_GROUPS` unless given)."""
    limit = MAX_GROUPS if limit is None else limit
    rows = list(
        Item.objects.filter(job_id__in=jobs)
        .order_by()
        .values("job_id", key=group_key(by))
        .annotate(**GROUP_SUMS)[: limit + 1]
    )
    if len(rows) > limit:
        raise TooManyGroups(by, limit)
    return rows


@dataclass
class GroupCost:
    """One group's items and what their drafts cost: `amount` (its share of the job's total) and
    `wasted` in `currency`, the same in USD as `provider_amount` and `provider_wasted`; None when the
    job's model has no known price."""

    key: str | None
    currency: str
    items: int = 0
    approved: int = 0
    amount: Decimal | None = None
    wasted: Decimal | None = None
    provider_amount: Decimal | None = None
    provider_wasted: Decimal | None = None
    # The drafts' cost at the job's price, in USD: what the job's figures are split by.
    drafts_usd: Decimal = Decimal(0)

    @property
    def label(self) -> str:
        return NO_VALUE if self.key is None else self.key

    @property
    def per_approved(self) -> Decimal | None:
        """The group's whole spend over its approved drafts, so waste raises it; None with none approved."""
        if self.amount is None or not self.approved:
            return None
        return (self.amount / self.approved).quantize(PLACES)

    def add(self, other: "GroupCost") -> None:
        self.items += other.items
        self.approved += other.approved
        self.drafts_usd += other.drafts_usd
        for name in ("amount", "wasted", "provider_amount", "provider_wasted"):
            if getattr(other, name) is not None:
                setattr(self, name, (getattr(self, name) or Decimal(0)) + getattr(other, name))


def _split(whole: Decimal | None, weights: list[Decimal]) -> list[Decimal | None]:
    if whole is None:
        return [None] * len(weights)
    # In the ledger's places, or the whole's own if it has more: every digit of it is shared out.
    places = min(PLACES, Decimal(1).scaleb(whole.as_tuple().exponent))
    return split_exactly(whole, weights, places)


def split_job_cost(cost: dict, price: Price | None, rows: list[dict]) -> list[GroupCost]:
    """The job's `cost` (`pricing.job_cost`) split over its groups' `rows` (`grouped_tokens`)."""
    drafts, wasted = [], []
    for row in rows:
        if price is None:
            drafts.append(Decimal(0))
            wasted.append(Decimal(0))
            continue
        drafts.append(price.cost(row["all_input"], row["all_output"]))
        wasted.append(
            price.cost(
                row["all_input"] - row["approved_input"] - row["pending_input"],
                row["all_output"] - row["approved_output"] - row["pending_output"],
            )
        )
    in_usd = cost["provider_currency"]
    columns = zip(
        rows,
        drafts,
        _split(cost["total"], drafts),
        _split(cost["wasted"], wasted),
        _split(in_usd["total"], drafts),
        _split(in_usd["wasted"], wasted),
        strict=True,
    )
    return [
        GroupCost(
            key=row["key"],
            currency=cost["currency"],
            items=row["items"],
            approved=row["approved_drafts"],
            amount=amount,
            wasted=wasted_amount,
            provider_amount=provider_amount,
            provider_wasted=provider_wasted,
            drafts_usd=usd,
        )
        for row, usd, amount, wasted_amount, provider_amount, provider_wasted in columns
    ]


def by_spend(groups: Iterable[GroupCost]) -> list[GroupCost]:
    """The dearest first, then the largest; the group without a value last among equals."""
    return sorted(groups, key=lambda g: (-g.drafts_usd, -g.items, g.key is None, g.key or ""))


def job_costs_by(job: Job, by: str) -> tuple[dict, list[GroupCost]]:
    """The job's cost (`pricing.job_cost`) and its split by `by`, the dearest group first."""
    rows = grouped_tokens([job.pk], by)
    cost = job_cost(job)
    return cost, by_spend(split_job_cost(cost, price_for(job.provider, job.model), rows))


@dataclass
class CostsAcrossJobs:
    """Many jobs' costs by one field, each job split as `job_costs_by` splits it and added up by group.
    Amounts are in `currency`; the jobs whose cost is in another one (no rate to it was in force) or
    unknown (no price for their model) count in `items` and `approved` but not in the amounts."""

    currency: str
    groups: list[GroupCost] = field(default_factory=list)
    jobs: int = 0
    left_out: int = 0

    @property
    def total(self) -> GroupCost:
        whole = GroupCost(key=None, currency=self.currency)
        for group in self.groups:
            whole.add(group)
        return whole


def costs_across_jobs(
    jobs: models.QuerySet[Job], by: str, currency: str, *, limit: int | None = None
) -> CostsAcrossJobs:
    """`jobs`' costs by `by` in `currency`, the dearest group first: one grouped query for the groups
    of every job (at most `limit` pairs of a job and a group, else TooManyGroups), and `jobs_cost`'s."""
    made_with = {pk: (provider, model) for pk, provider, model in jobs.values_list("pk", "provider", "model")}
    rows_of_job: dict[int, list[dict]] = {}
    for row in grouped_tokens(jobs.values("pk"), by, limit=limit):
        rows_of_job.setdefault(row["job_id"], []).append(row)
    costs = jobs_cost(rows_of_job)
    across = CostsAcrossJobs(currency, jobs=len(made_with))
    groups: dict[str | None, GroupCost] = {}
    for job_id, rows in rows_of_job.items():
        cost = costs[job_id]
        counted = cost["total"] is not None and cost["currency"] == currency
        across.left_out += not counted
        for part in split_job_cost(cost, price_for(*made_with[job_id]), rows):
            if not counted:
                part.amount = part.wasted = None
            groups.setdefault(part.key, GroupCost(key=part.key, currency=currency)).add(part)
    across.groups = by_spend(groups.values())
    return across


def costs_by_set_up(jobs: models.QuerySet[Job], currency: str) -> CostsAcrossJobs:
    """`jobs`' costs by their prompt version and model, in `currency`, the dearest first: a job is
    wholly in one group, so its tallies and `jobs_cost` say it all, without reading its items."""
    made_with = {
        pk: f"{task} v{version} · {model}"
        for pk, task, version, model in jobs.values_list(
            "pk", "prompt_version__task", "prompt_version__version", "model"
        )
    }
    tallies = (
        ItemTally.objects.filter(job_id__in=jobs.values("pk"))
        .order_by()
        .values_list("job_id")
        .annotate(items=Sum("items"), approved=Sum("approved_drafts"))
    )
    costs = jobs_cost(made_with)
    across = CostsAcrossJobs(currency, jobs=len(made_with))
    groups: dict[str | None, GroupCost] = {}
    for job_id, items, approved in tallies:
        cost = costs[job_id]
        counted = cost["total"] is not None and cost["currency"] == currency
        across.left_out += not counted
        in_usd = cost["provider_currency"]
        part = GroupCost(
            key=made_with[job_id],
            currency=currency,
            items=items,
            approved=approved,
            amount=cost["total"] if counted else None,
            wasted=cost["wasted"] if counted else None,
            provider_amount=in_usd["total"],
            provider_wasted=in_usd["wasted"],
            drafts_usd=in_usd["total"] or Decimal(0),
        )
        groups.setdefault(part.key, GroupCost(key=part.key, currency=currency)).add(part)
    across.groups = by_spend(groups.values())
    return across

"""What drafts cost (SPEC §9): a price table per provider and model, and cost sums over versions.

Each provider has list prices per model (USD per million input and output tokens) and one batch
discount. The built-in table below can be overridden and extended by the JSON file named in the
setting `BATCHDESK_PRICE_FILE` (its format is in the README), since prices change more often than
releases. A model the table does not name has no known price: its costs are None and the screens
and the API say "price unknown for <provider>/<model>", rather than pricing it like another model.

Costs are summed in the database: a job's token counts are added up per partition (approved,
pending, all) in one aggregate query and priced afterwards, since one job has one provider and
one model; what its settled units kept is summed in another (`jobs_cost`). Prices are USD; a job's
amounts are in the business currency, as `Decimal`.
"""

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count, Max, Min, Q, Sum

from ..models import GeneratedVersion, ItemTally, Job, UnitCharge
from ..providers import provider_names
from ..setting_files import WatchedFile, file_number, read_setting_file, setting_refused
from .apportion import split_exactly
from .currency import PLACES, PROVIDER_CURRENCY, SAME_CURRENCY, Rate, business_currency, rate_now

log = logging.getLogger(__name__)

MILLION = Decimal(1_000_000)
HALF = Decimal("0.5")
# The key of a price for every model of a provider that the table does not name.
ANY_MODEL = "*"


@dataclass(frozen=True)
class Price:
    """List prices in USD per million tokens, and the share taken off them for batch work."""

    input_per_million: Decimal
    output_per_million: Decimal
    batch_discount: Decimal = HALF  # 0.5 = 50 % off the list price; 0 = none
    note: str = ""  # said beside the price, e.g. why no discount is assumed

    def cost(self, input_tokens: int, output_tokens: int) -> Decimal:
        gross = (input_tokens * self.input_per_million + output_tokens * self.output_per_million) / MILLION
        return gross * (1 - self.batch_discount)

    @property
    def discount_percent(self) -> Decimal:
        percent = 100 * self.batch_discount
        return percent.quantize(1) if percent == percent.to_integral_value() else percent.normalize()


@dataclass(frozen=True)
class ProviderPrices:
    """One provider's prices: its batch discount, and a list price per model (`ANY_MODEL` for all)."""

    batch_discount: Decimal
    models: dict[str, tuple[Decimal, Decimal]] = field(default_factory=dict)
    note: str = ""


def _models(**prices: tuple[str, str]) -> dict[str, tuple[Decimal, Decimal]]:
    return {name: (Decimal(i), Decimal(o)) for name, (i, o) in prices.items()}


# List prices as published by each provider (USD per million tokens). They go out of date: a
# price file corrects them without a release.
BUILT_IN: dict[str, ProviderPrices] = {
    # OpenAI Batch API: 50 % off.
    "openai": ProviderPrices(
        HALF,
        _models(
            **{
                "gpt-4o-mini": ("0.15", "0.60"),
                "gpt-4o": ("2.50", "10.00"),
                "gpt-4.1-nano": ("0.10", "0.40"),
                "gpt-4.1-mini": ("0.40", "1.60"),
                "gpt-4.1": ("2.00", "8.00"),
                "gpt-5-nano": ("0.05", "0.40"),
                "gpt-5-mini": ("0.25", "2.00"),
                "gpt-5": ("1.25", "10.00"),
            }
        ),
    ),
    # Anthropic Message Batches: 50 % of standard prices for all usage.
    "anthropic": ProviderPrices(
        HALF,
        _models(
            **{
                "claude-3-haiku": ("0.25", "1.25"),
                "claude-3-5-haiku": ("0.80", "4.00"),
                "claude-haiku-4-5": ("1.00", "5.00"),
                "claude-3-7-sonnet": ("3.00", "15.00"),
                "claude-sonnet-4": ("3.00", "15.00"),
                "claude-sonnet-4-5": ("3.00", "15.00"),
                "claude-opus-4": ("15.00", "75.00"),
                "claude-opus-4-1": ("15.00", "75.00"),
            }
        ),
    ),
    # Gemini Batch Mode: 50 % off. Prices for prompts up to 200,000 tokens (ours are far smaller).
    "gemini": ProviderPrices(
        HALF,
        _models(
            **{
                "gemini-2.0-flash": ("0.10", "0.40"),
                "gemini-2.5-flash-lite": ("0.10", "0.40"),
                "gemini-2.5-flash": ("0.30", "2.50"),
                "gemini-2.5-pro": ("1.25", "10.00"),
            }
        ),
    ),
    # Workers AI per-model prices (billed in neurons). Cloudflare states no discount for its
    # asynchronous batch API, so none is assumed.
    "cloudflare": ProviderPrices(
        Decimal(0),
        _models(
            **{
                "@cf/meta/llama-3.1-8b-instruct-fp8": ("0.152", "0.287"),
                "@cf/meta/llama-3.3-70b-instruct-fp8-fast": ("0.293", "2.253"),
                "@cf/meta/llama-4-scout-17b-16e-instruct": ("0.270", "0.850"),
            }
        ),
        note="Cloudflare states no batch discount: none is assumed.",
    ),
    # A self-hosted server costs nothing per token here; a price file may say otherwise.
    "openai_compatible": ProviderPrices(
        Decimal(0),
        {ANY_MODEL: (Decimal(0), Decimal(0))},
        note="Self-hosted: no price per token unless the price file gives one.",
    ),
}
# The emulator speaks OpenAI's batch API and is priced like the model it names at OpenAI, so a
# demo shows what the same work would cost for real.
PRICED_LIKE = {"emulator": "openai"}
# A snapshot of a model is priced as the model: a date (`gpt-4o-2024-08-06`,
# `claude-sonnet-4-20250514`), a version number (`gemini-2.0-flash-001`, `gpt-4-0613`) or `latest`.
# Nothing else is cut off: `gpt-4o-mini` is never priced as `gpt-4o`.
SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{3,4}|latest)$")


# --- the price file ------------------------------------------------------------------------


class PriceFileError(ImproperlyConfigured):
    """The price file cannot be read or says something that is not a price."""


def _amount(value, where: str) -> Decimal:
    amount = file_number(value, where, what="a number of USD", error=PriceFileError)
    if not amount.is_finite() or amount < 0:
        raise PriceFileError(f"{where}: must be a number of USD of 0 or more, not {value}")
    return amount


def _object(value, where: str, allowed: Iterable[str] | None = None) -> dict:
    """A JSON object without its comment keys (those starting with `_`); with `allowed`, no other keys."""
    if not isinstance(value, dict):
        raise PriceFileError(f"{where}: must be a JSON object")
    value = {key: item for key, item in value.items() if not key.startswith("_")}
    if allowed is not None and (unknown := sorted(set(value) - set(allowed))):
        raise PriceFileError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(sorted(allowed))}")
    return value


def merge_price_file(data, base: dict[str, ProviderPrices]) -> dict[str, ProviderPrices]:
    """`base` with what a price file's JSON says laid over it, provider by provider, model by model.
    A model set to null has no known price any more."""
    table = dict(base)
    known = [name for name in provider_names() if name not in PRICED_LIKE]
    for provider, entry in _object(data, "the file").items():
        if provider in PRICED_LIKE:
            raise PriceFileError(
                f"{provider}: is priced like {PRICED_LIKE[provider]}; give those prices instead"
            )
        if provider not in known:
            raise PriceFileError(f"{provider}: not a provider; expected one of {', '.join(known)}")
        entry = _object(entry, provider, allowed=("batch_discount_percent", "models", "note"))
        current = table.get(provider, ProviderPrices(Decimal(0)))
        discount = current.batch_discount
        if "batch_discount_percent" in entry:
            percent = _amount(entry["batch_discount_percent"], f"{provider}.batch_discount_percent")
            if percent > 100:
                raise PriceFileError(f"{provider}.batch_discount_percent: at most 100, not {percent}")
            discount = percent / 100
        note = entry.get("note", current.note)
        if not isinstance(note, str):
            raise PriceFileError(f"{provider}.note: must be text")
        models = dict(current.models)
        for model, price in _object(entry.get("models", {}), f"{provider}.models").items():
            where = f"{provider}.models.{model}"
            if price is None:
                models.pop(model, None)
                continue
            price = _object(price, where, allowed=("input_per_million", "output_per_million"))
            if missing := [key for key in ("input_per_million", "output_per_million") if key not in price]:
                raise PriceFileError(f"{where}: {missing[0]} is missing")
            models[model] = (
                _amount(price["input_per_million"], f"{where}.input_per_million"),
                _amount(price["output_per_million"], f"{where}.output_per_million"),
            )
        table[provider] = ProviderPrices(discount, models, note)
    return table


def read_price_file(path: str) -> dict[str, ProviderPrices]:
    """The built-in table with the price file at `path` laid over it; PriceFileError when it cannot be."""
    return read_setting_file(
        "BATCHDESK_PRICE_FILE", path, lambda data: merge_price_file(data, BUILT_IN), PriceFileError
    )


# A table that never read well: no price is known.
_price_file = WatchedFile(read_price_file, PriceFileError, empty=dict)


def price_table() -> dict[str, ProviderPrices]:
    """The prices in force: the built-in table, or the price file laid over it, read again when the
    file changes. A file that turns bad while running is logged and its last good reading kept (or,
    if there never was one, no price is known): the system check refuses a bad file at startup."""
    path = getattr(settings, "BATCHDESK_PRICE_FILE", "")
    return _price_file.get(path) if path else BUILT_IN


def check_price_file(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """System check: a bad price file stops the web server and the workers at startup."""
    return setting_refused(
        "BATCHDESK_PRICE_FILE",
        read_price_file,
        PriceFileError,
        hint="Fix the file, or unset BATCHDESK_PRICE_FILE.",
        id="batchdesk.E001",
    )


# --- looking prices up ---------------------------------------------------------------------


def unknown_price(provider: str, model: str) -> str:
    return f"price unknown for {provider}/{model}"


def price_for(provider: str, model: str) -> Price | None:
    """The price of `model` at `provider`, or None when the table has none. A snapshot of a model
    (`gpt-4o-mini-2024-07-18`) is priced as the model; no other model is ever used instead."""
    prices = price_table().get(PRICED_LIKE.get(provider, provider))
    if prices is None:
        return None
    name = model.removeprefix("models/")  # Gemini's resource names
    found = prices.models.get(name)
    if found is None and (snapshot := SNAPSHOT.search(name)):
        found = prices.models.get(name[: snapshot.start()])
    if found is None:
        found = prices.models.get(ANY_MODEL)
    if found is None:
        return None
    return Price(found[0], found[1], prices.batch_discount, prices.note)


def priced_models() -> list[str]:
    """Every model the table names, for the start screen's suggestions."""
    return sorted({model for prices in price_table().values() for model in prices.models} - {ANY_MODEL})


def is_apportioned(version: GeneratedVersion) -> bool:
    """Whether the version's tokens are its share of a unit-wide total (the provider gave usage only
    for the whole unit): its cost is then a share too."""
    return bool((version.usage or {}).get("apportioned"))


def version_cost(version: GeneratedVersion) -> Decimal | None:
    job = version.item.job
    price = price_for(job.provider, job.model)
    if price is None:
        return None
    return price.cost(version.input_tokens, version.output_tokens).quantize(PLACES)


# --- sums over many versions ---------------------------------------------------------------

# A draft of an item in DISCARDED_STATES will never be published; the latest draft of an item in
# UNDECIDED_STATES is still waiting for a decision (ledger/states.py: the tallies' own lists).

# Every token sum comes from the job's item tallies (`ItemTally`), which the database keeps with
# every change: approved (the draft an item's approval names, unless the product moved on or went
# away), pending (the latest draft of an item still to be decided on) and every draft. Everything
# else is wasted: rejected, invalid, obsolete or withdrawn drafts, and drafts a retry replaced.
TALLY_SUMS = {
    name: Sum(name)
    for name in (
        "items",
        "all_input",
        "all_output",
        "approved_input",
        "approved_output",
        "approved_drafts",
        "pending_input",
        "pending_output",
        "apportioned_drafts",
    )
}


def _divide(amount: Decimal, count: int) -> Decimal | None:
    return (amount / count).quantize(PLACES) if count else None


def _price_json(price: Price | None) -> dict | None:
    if price is None:
        return None
    return {
        "input_per_million": price.input_per_million,
        "output_per_million": price.output_per_million,
        "batch_discount_percent": price.discount_percent,
        "note": price.note,
    }


def jobs_cost(job_ids: Iterable[int]) -> dict[int, dict]:
    """`job_cost` for many jobs at once: three aggregate queries whatever their size (the jobs, their
    tallies and their settled units), and today's rate."""
    job_ids = list(job_ids)
    jobs = {
        pk: (provider, model)
        for pk, provider, model in Job.objects.filter(pk__in=job_ids).values_list("pk", "provider", "model")
    }
    rows = {
        row["job_id"]: row
        for row in ItemTally.objects.filter(job_id__in=job_ids)
        .order_by()
        .values("job_id")
        .annotate(**TALLY_SUMS)
    }
    settled = settled_units(job_ids)
    today = rate_now()
    costs = {}
    for job_id in job_ids:
        provider, model = jobs.get(job_id, ("", ""))
        price = price_for(provider, model)
        row = rows.get(job_id) or {}
        input_tokens, output_tokens = row.get("all_input") or 0, row.get("all_output") or 0
        cost = {
            # Without a price there is no amount: only the currency it would be in.
            "currency": business_currency() if today is not None else PROVIDER_CURRENCY,
            "price_known": price is not None,
            "price_note": unknown_price(provider, model) if price is None else price.note,
            "price": _price_json(price),
            **dict.fromkeys(AMOUNTS),
            "settled": None,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "apportioned_drafts": row.get("apportioned_drafts") or 0,
            "provider_currency": {"currency": PROVIDER_CURRENCY, **dict.fromkeys(AMOUNTS)},
            "rate": None,
            "rate_note": "",
        }
        if price is not None:
            cost.update(priced_cost(price, row, settled.get(job_id) or {}, today))
        costs[job_id] = cost
    return costs


AMOUNTS = ("total", "approved", "pending", "wasted", "per_item", "per_approved_draft")
WEIGHTED = "the rates its units were settled at, weighted"
WEIGHTED_WITH_TODAY = "the rates its units were settled at and today's rate, weighted"
RATE_PLACES = Decimal("0.00000001")


def settled_units(job_ids: list[int]) -> dict[int, dict]:
    """What each job's settled units kept, in one grouped query: their tokens and provider amounts,
    and, of those kept in the business currency (`kept`), the sum and the rates. A unit settled with
    no known price is left out: its drafts are priced as if it had not settled."""
    kept = Q(cost__isnull=False, currency=business_currency())
    return {
        row["job_id"]: row
        for row in UnitCharge.objects.filter(
            job_id__in=job_ids, settled_at__isnull=False, cost_usd__isnull=False
        )
        .order_by()
        .values("job_id")
        .annotate(
            units=Count("pk"),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            usd=Sum("cost_usd"),
            kept_units=Count("pk", filter=kept),
            kept=Sum("cost", filter=kept),
            lowest=Min("rate", filter=kept),
            highest=Max("rate", filter=kept),
            latest=Max("rate_date", filter=kept),
            source=Max("rate_source", filter=kept),
        )
    }


def priced_cost(price: Price, tallied: dict, settled: dict, today: Rate | None) -> dict:
    """A job's amounts (SPEC §9): what its settled units kept, plus its drafts not settled yet at
    today's rate, so the job's `total` is the sum of its receipts (`ledger.money.receipts`) and what is
    still to settle. When a unit was settled with no rate in force (or today's is needed and there is
    none), every amount is in USD and `rate_note` says so. `approved`, `pending` and `wasted` are the
    total split by their drafts' USD cost, and add up to it exactly; `provider_currency` gives the
    drafts' tokens at the price, in USD."""
    approved_usd = price.cost(tallied.get("approved_input") or 0, tallied.get("approved_output") or 0)
    pending_usd = price.cost(tallied.get("pending_input") or 0, tallied.get("pending_output") or 0)
    all_usd = price.cost(tallied.get("all_input") or 0, tallied.get("all_output") or 0)
    unsettled_usd = price.cost(
        (tallied.get("all_input") or 0) - (settled.get("input_tokens") or 0),
        (tallied.get("all_output") or 0) - (settled.get("output_tokens") or 0),
    )
    items, approved_drafts = tallied.get("items") or 0, tallied.get("approved_drafts") or 0
    units, kept_units = settled.get("units") or 0, settled.get("kept_units") or 0
    # Every settled unit kept its amount in the business currency, and a rate is in force for the rest.
    converted = kept_units == units and (today is not None or (units > 0 and not unsettled_usd))
    rate, rate_note = None, ""
    if converted:
        currency = business_currency()
        # Quantized: SQLite (the demo's database) sums decimals as floats.
        receipts = Decimal(settled.get("kept") or 0).quantize(PLACES)
        total = receipts + ((unsettled_usd * today.per_usd).quantize(PLACES) if unsettled_usd else 0)
        rate = job_rate(settled, today, total, all_usd, bool(unsettled_usd))
    else:
        currency = PROVIDER_CURRENCY
        receipts = Decimal(settled.get("usd") or 0).quantize(PLACES)
        total = receipts + unsettled_usd.quantize(PLACES)
        if kept_units < units:
            rate_note = (
                f"{units - kept_units} of its units settled with no rate from USD to {business_currency()} "
                "in force: amounts in USD"
            )
        else:
            rate_note = f"no rate from USD to {business_currency()} is in force: amounts in USD"
    approved, pending, wasted = split_exactly(
        total, [approved_usd, pending_usd, all_usd - approved_usd - pending_usd]
    )
    return {
        "currency": currency,
        "total": total,
        "approved": approved,
        "pending": pending,
        "wasted": wasted,
        "per_item": _divide(total, items),
        "per_approved_draft": _divide(total, approved_drafts),
        "settled": receipts,
        "provider_currency": {
            "currency": PROVIDER_CURRENCY,
            "total": all_usd.quantize(PLACES),
            "approved": approved_usd.quantize(PLACES),
            "pending": pending_usd.quantize(PLACES),
            "wasted": (all_usd - approved_usd - pending_usd).quantize(PLACES),
            "per_item": _divide(all_usd, items),
            "per_approved_draft": _divide(all_usd, approved_drafts),
        },
        "rate": rate.as_json() if rate is not None and rate is not SAME_CURRENCY else None,
        "rate_note": rate_note,
    }


def job_rate(settled: dict, today: Rate, total: Decimal, all_usd: Decimal, unsettled: bool) -> Rate:
    """The rate a job's amounts stand at: the one rate its settled units kept (and today's, for drafts
    not settled yet, when it is the same), or else their weighted rate, the job's total over its USD."""
    if not settled.get("units"):
        return today
    lowest, highest = settled["lowest"], settled["highest"]
    if lowest == highest and (not unsettled or today.per_usd == lowest):
        return Rate(lowest, settled["latest"], settled["source"])
    latest = max(settled["latest"], today.valid_from) if unsettled else settled["latest"]
    per_usd = (total / all_usd).quantize(RATE_PLACES) if all_usd else highest
    return Rate(per_usd, latest, WEIGHTED_WITH_TODAY if unsettled else WEIGHTED)


def job_cost(job) -> dict:
    """What a job's drafts cost: `total` = `approved` + `pending` (drafts still to be decided on)
    + `wasted` (rejected, invalid, obsolete, withdrawn, or replaced by a retry), exactly. `total` is
    also what its settled units kept (`settled`, the sum of its receipts) plus its drafts not settled
    yet: the one figure every column of amounts splits (the export, costs by category).
    `per_approved_draft` is the whole spend divided by the drafts approved, so waste raises it. When
    the job's model has no known price, every amount is None and `price_note` says so."""
    return jobs_cost([job.pk])[job.pk]


@dataclass(frozen=True)
class DraftSpend:
    """Draft spend: what every draft recorded so far cost at its job's batch price, in USD, whether or
    not its unit is settled yet: `total` over the models with a known price, and the tokens of those
    without one, by (provider, model). Not what providers charged for settled units
    (`budgets.settled_spend_by_currency`)."""

    total: Decimal
    unpriced_tokens: dict[tuple[str, str], int]


def priced_spend(rows: Iterable[tuple[str, str, int, int]]) -> DraftSpend:
    """The draft spend of `(provider, model, input tokens, output tokens)` rows, each provider and model
    at most once: every draft, for `/metrics`, and the day's drafts, for the dashboard, are priced alike."""
    total, unpriced = Decimal(0), {}
    for provider, model, input_tokens, output_tokens in rows:
        price = price_for(provider, model)
        if price is None:
            unpriced[(provider, model)] = input_tokens + output_tokens
        else:
            total += price.cost(input_tokens, output_tokens)
    return DraftSpend(total.quantize(PLACES), unpriced)


def draft_spend() -> DraftSpend:
    """One query grouped by provider and model."""
    return priced_spend(
        ItemTally.objects.order_by()
        .values_list("job__provider", "job__model")
        .annotate(all_input=Sum("all_input"), all_output=Sum("all_output"))
    )


def total_draft_spend() -> Decimal:
    """Every draft's cost at its job's batch price, in USD, across all jobs (models with a known price)."""
    return draft_spend().total

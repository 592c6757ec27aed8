"""Receipts (SPEC §1, "receipt"): what each settled unit of a job was charged, as it was kept when it
settled (`UnitCharge`): the provider's reference, tokens in and out, the provider's amount in USD, the
rate with its date and source, and the amount in the job's currency. The job's API, its page and the
finance team's CSV read them from here.

A receipt's `amount` is in the currency of the job's cost (`pricing.job_cost`): the business currency
when every unit kept a rate, else USD (a unit settled with no rate in force: SPEC §9, a cost with no
rate is shown in the provider's currency). So the receipts add up to the job cost's `settled` exactly,
and its `total` is that plus the drafts whose unit has not settled yet (`unsettled`).
"""

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from django.db.models import QuerySet

from ..models import UnitCharge
from .currency import PROVIDER_CURRENCY, business_currency


def settled_charges(job_id: int) -> QuerySet[UnitCharge]:
    """The job's settled units with what a receipt shows, oldest settlement first."""
    return (
        UnitCharge.objects.filter(job_id=job_id, settled_at__isnull=False)
        .select_related("submission")
        .only(
            "pk",
            "currency",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "cost",
            "settled_at",
            "rate",
            "rate_date",
            "rate_source",
            "submission__provider_ref",
            "submission__provider",
            "submission__model",
        )
        .order_by("settled_at", "pk")
    )


RECEIPT_ORDER = ["settled_at", "id"]


@dataclass(frozen=True)
class Receipt:
    submission: int
    provider_ref: str
    settled_at: datetime
    input_tokens: int
    output_tokens: int
    provider_amount: Decimal | None
    provider_currency: str
    rate: Decimal | None
    # The currency the rate converts USD into: the business currency when the unit settled.
    rate_currency: str
    rate_date: date | None
    rate_source: str
    amount: Decimal | None
    currency: str
    # Why the amount is in USD, or why there is none; "" when it is as kept in the business currency.
    note: str

    def as_json(self) -> dict:
        return {
            "submission": self.submission,
            "provider_ref": self.provider_ref,
            "settled_at": self.settled_at,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "provider_amount": self.provider_amount,
            "provider_currency": self.provider_currency,
            "rate": self.rate,
            "rate_currency": self.rate_currency,
            "rate_date": self.rate_date,
            "rate_source": self.rate_source,
            "amount": self.amount,
            "currency": self.currency,
            "note": self.note,
        }


def receipt(charge: UnitCharge, currency: str) -> Receipt:
    """The settled `charge` as a receipt whose amount is in `currency`, the currency of its job's cost."""
    kept = charge.cost is not None and charge.currency == business_currency()
    if charge.cost_usd is None:
        submission = charge.submission
        amount, note = (
            None,
            f"no price was known for {submission.provider}/{submission.model} when it settled",
        )
    elif currency == business_currency() and kept:
        amount, note = charge.cost, ""
    else:
        amount = charge.cost_usd
        if charge.cost is None:
            note = f"no rate from USD to {business_currency()} was in force when it settled: amount in USD"
        elif not kept:
            note = f"kept as {charge.cost} {charge.currency}, not {business_currency()}: amount in USD"
        else:
            note = "the job's cost is in USD (see its rate note): amount in USD"
    return Receipt(
        submission=charge.submission_id,
        provider_ref=charge.submission.provider_ref,
        settled_at=charge.settled_at,
        input_tokens=charge.input_tokens,
        output_tokens=charge.output_tokens,
        provider_amount=charge.cost_usd,
        provider_currency=PROVIDER_CURRENCY,
        rate=charge.rate,
        rate_currency=charge.currency if charge.rate is not None else "",
        rate_date=charge.rate_date,
        rate_source=charge.rate_source,
        amount=amount,
        currency=currency,
        note=note,
    )


def unsettled(cost: dict) -> Decimal | None:
    """What of a job's cost (`pricing.job_cost`) no receipt carries yet: its drafts whose unit has not
    settled. None when the job's model has no known price."""
    if cost["total"] is None:
        return None
    return cost["total"] - cost["settled"]

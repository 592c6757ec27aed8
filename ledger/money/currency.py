"""Money in the business's currency (SPEC §9).

Providers price in US dollars (`ledger.money.pricing`). The business sees and budgets in its own currency,
`BATCHDESK_CURRENCY` (default GBP), converted with the rate in force on the day a cost was incurred:
the value of one US dollar from each dated rate on, read from `BATCHDESK_FX_FILE` (dated rates with
their source) or entered by an admin (`ExchangeRate`), both held to one rule (`per_usd_problem`,
`rate_date_problem`). An admin's rate for a date wins over the file's for the same date, and a
newer admin's rate for the same date and currency corrects an older one, which is kept. A cost keeps the provider's amount, the rate, its date and its source
(`UnitCharge`), so its history never changes when a rate does. With no rate in force, an amount stays
in the provider's currency and says so.
"""

import logging
import re
import time
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from ..models import ExchangeRate
from ..setting_files import WatchedFile, file_number, read_setting_file, setting_refused

log = logging.getLogger(__name__)

PROVIDER_CURRENCY = "USD"
CURRENCY_CODE = re.compile(r"^[A-Z]{3}$")
PLACES = Decimal("0.000001")
# What a rate may be, in the file and in the admin alike: a ledger's history starts in 2000.
HIGHEST_RATE = Decimal(1_000_000)
EARLIEST_RATE_DATE = date(2000, 1, 1)


def business_currency() -> str:
    return settings.BATCHDESK_CURRENCY


@dataclass(frozen=True)
class Rate:
    """One US dollar is worth `per_usd` of the business currency from `valid_from` on."""

    per_usd: Decimal
    valid_from: date
    source: str

    def as_json(self) -> dict:
        return {"per_usd": self.per_usd, "date": self.valid_from.isoformat(), "source": self.source}


# The business currency is the provider's: nothing to convert.
SAME_CURRENCY = Rate(Decimal(1), date.min, "the business currency is the provider's")


# --- what a rate may be ------------------------------------------------------------------


def per_usd_problem(per_usd: Decimal) -> str | None:
    """Why `per_usd` cannot be a rate, or None: above 0 and below 1,000,000."""
    if not per_usd.is_finite() or not 0 < per_usd < HIGHEST_RATE:
        return "must be a number above 0 and below 1,000,000"
    return None


def rate_date_problem(valid_from: date) -> str | None:
    """Why a rate cannot be dated `valid_from`, or None: from 2000-01-01 to today."""
    if valid_from < EARLIEST_RATE_DATE:
        return f"is before {EARLIEST_RATE_DATE.isoformat()}: a rate is dated from then on"
    today = timezone.localdate()
    if valid_from > today:
        return f"is in the future (today is {today.isoformat()}): a rate is dated the day it was quoted"
    return None


# --- the rate file -----------------------------------------------------------------------


class RateFileError(ImproperlyConfigured):
    """The rate file cannot be read or says something that is not a rate."""


def parse_rate_file(data) -> list[Rate]:
    """`{"source": "...", "per_usd": {"2026-11-28": "0.7912", ...}}` as rates, oldest first."""
    if not isinstance(data, dict):
        raise RateFileError("must be a JSON object with 'source' and 'per_usd'")
    data = {key: value for key, value in data.items() if not key.startswith("_")}
    if unknown := sorted(set(data) - {"source", "per_usd", "currency"}):
        raise RateFileError(f"unknown key {unknown[0]!r}; expected source, per_usd (and currency)")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip() or len(source) > 200:
        raise RateFileError("source: must say where the rates come from (text of 1-200 characters)")
    currency = data.get("currency", business_currency())
    if currency != business_currency():
        raise RateFileError(
            f"currency: the file gives {currency!r} rates, the business currency is {business_currency()}"
        )
    per_usd = data.get("per_usd")
    if not isinstance(per_usd, dict) or not per_usd:
        raise RateFileError('per_usd: must be an object of dates and rates, e.g. {"2026-12-01": "0.7890"}')
    rates = []
    for day, value in per_usd.items():
        try:
            valid_from = date.fromisoformat(day)
        except ValueError:
            raise RateFileError(f"per_usd: {day!r} is not a date (YYYY-MM-DD)") from None
        if problem := rate_date_problem(valid_from):
            raise RateFileError(f"per_usd: {day} {problem}")
        rates.append(Rate(_rate_value(value, f"per_usd.{day}"), valid_from, source.strip()))
    return sorted(rates, key=lambda rate: rate.valid_from)


def _rate_value(value, where: str) -> Decimal:
    amount = file_number(value, where, what="a number", error=RateFileError)
    if problem := per_usd_problem(amount):
        raise RateFileError(f"{where}: {problem}, not {value}")
    return amount


def read_rate_file(path: str) -> list[Rate]:
    return read_setting_file("BATCHDESK_FX_FILE", path, parse_rate_file, RateFileError)


_rate_file = WatchedFile(read_rate_file, RateFileError, empty=list)


def file_rates() -> list[Rate]:
    """The rate file's rates, read again when the file (or the business currency) changes; a file
    that turns bad while running is logged and its last good reading kept (the system check refuses
    a bad file at startup)."""
    path = settings.BATCHDESK_FX_FILE
    return _rate_file.get(path, also=(business_currency(),)) if path else []


def check_rate_file(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """System check: a bad currency or rate file stops the web server and the workers at startup."""
    currency = getattr(settings, "BATCHDESK_CURRENCY", "")
    if not CURRENCY_CODE.match(currency or ""):
        return [
            checks.Error(
                f"BATCHDESK_CURRENCY {currency!r} is not a currency code such as GBP", id="batchdesk.E002"
            )
        ]
    return setting_refused(
        "BATCHDESK_FX_FILE",
        read_rate_file,
        RateFileError,
        hint="Fix the file, or unset BATCHDESK_FX_FILE.",
        id="batchdesk.E003",
    )


# --- the rate in force ---------------------------------------------------------------------


# Rates entered by admins are read at most this often by each process (and at once in the process
# that saves one): a page of fifty costs asks once, not fifty times.
ENTERED_RATES_SECONDS = 5.0


@dataclass
class _Entered:
    read_at: float = float("-inf")
    rates: dict[str, list[Rate]] = field(default_factory=dict)


_entered = _Entered()


def forget_entered_rates(**kwargs) -> None:
    """Connected to ExchangeRate's saves and deletions (ledger/apps.py)."""
    _entered.read_at = float("-inf")


def entered_rates(currency: str) -> list[Rate]:
    """Admins' rates for `currency`, oldest first; of one date, the last entered last, so that it is
    the one in force (a correction: `ExchangeRate.objects.with_corrections`)."""
    now = time.monotonic()
    if now - _entered.read_at > ENTERED_RATES_SECONDS:
        rates: dict[str, list[Rate]] = {}
        rows = ExchangeRate.objects.select_related("entered_by").order_by("valid_from", "pk")
        for row in rows:
            rates.setdefault(row.currency, []).append(Rate(row.per_usd, row.valid_from, row.source_text))
        _entered.rates, _entered.read_at = rates, now
    return _entered.rates.get(currency, [])


def rate_on(day: date) -> Rate | None:
    """The rate in force on `day`: the latest dated on or before it, an admin's before the file's
    for the same date. None when no rate is that old."""
    currency = business_currency()
    if currency == PROVIDER_CURRENCY:
        return SAME_CURRENCY
    entered = None
    for rate in entered_rates(currency):
        if rate.valid_from <= day:
            entered = rate
    from_file = None
    for rate in file_rates():
        if rate.valid_from <= day:
            from_file = rate
    if entered is not None and (from_file is None or entered.valid_from >= from_file.valid_from):
        return entered
    return from_file


def rate_now() -> Rate | None:
    return rate_on(timezone.localdate())


@dataclass(frozen=True)
class Money:
    """An amount as shown: in the business currency when a rate was in force, else in the provider's
    (`converted` False), with the provider's amount and the rate beside it."""

    amount: Decimal
    currency: str
    provider_amount: Decimal
    rate: Rate | None

    @property
    def converted(self) -> bool:
        return self.rate is not None

    def as_json(self) -> dict:
        return {
            "amount": self.amount,
            "currency": self.currency,
            "provider_amount": self.provider_amount,
            "provider_currency": PROVIDER_CURRENCY,
            "rate": self.rate.as_json() if self.rate else None,
        }


def convert(usd: Decimal, rate: Rate | None) -> Decimal | None:
    return None if rate is None else (usd * rate.per_usd).quantize(PLACES)


def in_business_currency(usd: Decimal, *, on: date | None = None) -> Money:
    """`usd` at the rate in force on `on` (today when not given)."""
    rate = rate_on(on or timezone.localdate())
    if rate is None:
        return Money(usd, PROVIDER_CURRENCY, usd, None)
    return Money(convert(usd, rate), business_currency(), usd, rate)

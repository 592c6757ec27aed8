"""Rates from USD to the business currency (SPEC §9): the rate in force on a day, the rate file's
checks at startup, and a file that turns bad while running."""

import json
from datetime import date
from decimal import Decimal

import pytest

from ledger.models import ExchangeRate
from ledger.money.currency import check_rate_file, in_business_currency, rate_on
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

SPEC_FILE = {
    "source": "Bank of England daily spot, 4 pm",
    "per_usd": {"2026-11-28": "0.7912", "2026-12-01": "0.7890"},
}


@pytest.fixture
def rate_file(settings, tmp_path):
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(SPEC_FILE))
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", str(path)
    return path


def test_a_rate_is_in_force_from_its_date_until_a_later_one(rate_file):
    assert rate_on(date(2026, 11, 27)) is None
    assert rate_on(date(2026, 11, 28)).per_usd == Decimal("0.7912")
    assert rate_on(date(2026, 11, 30)).per_usd == Decimal("0.7912")  # SPEC §9's example
    assert rate_on(date(2026, 12, 1)).per_usd == Decimal("0.7890")
    assert rate_on(date(2026, 12, 1)).source == "Bank of England daily spot, 4 pm"


def test_an_admins_rate_for_a_date_wins_over_the_files_and_the_latest_entered_wins(rate_file):
    admin = UserFactory(username="chief", roles=["admin"])
    for per_usd in ("0.8000", "0.8100"):
        ExchangeRate.objects.create(
            currency="GBP", valid_from=date(2026, 12, 1), per_usd=per_usd, source="desk"
        )
    ExchangeRate.objects.filter(per_usd=Decimal("0.81")).update(entered_by=admin)

    assert rate_on(date(2026, 12, 2)).per_usd == Decimal("0.8100")
    assert rate_on(date(2026, 11, 29)).per_usd == Decimal("0.7912")
    assert ExchangeRate.objects.filter(currency="EUR").count() == 0


def test_with_the_providers_currency_nothing_is_converted(settings):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "USD", ""
    shown = in_business_currency(Decimal("1.5"))
    assert (shown.amount, shown.currency, shown.converted) == (Decimal("1.5"), "USD", True)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (json.dumps({"per_usd": {"2026-12-01": "0.79"}}), "source"),
        (json.dumps({"source": "x", "per_usd": {}}), "per_usd"),
        (json.dumps({"source": "x", "per_usd": {"1 December": "0.79"}}), "is not a date"),
        (json.dumps({"source": "x", "per_usd": {"2026-12-01": "-1"}}), "above 0"),
        (json.dumps({"source": "x", "per_usd": {"2026-12-01": "NaN"}}), "above 0"),
        (json.dumps({"source": "x", "per_usd": {"2026-12-01": True}}), "must be a number"),
        (
            json.dumps({"source": "x", "currency": "EUR", "per_usd": {"2026-12-01": "0.9"}}),
            "business currency is GBP",
        ),
        (json.dumps({"source": "x", "rates": {}}), "unknown key"),
    ],
)
def test_a_bad_rate_file_stops_every_process_at_startup_naming_the_problem(rate_file, content, words):
    rate_file.write_text(content)

    [error] = check_rate_file()

    assert error.id == "batchdesk.E003"
    assert "BATCHDESK_FX_FILE" in error.msg and str(rate_file) in error.msg and words in error.msg


def test_a_missing_rate_file_and_a_currency_that_is_no_code_are_refused_at_startup(settings, tmp_path):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", str(tmp_path / "nowhere.json")
    [missing] = check_rate_file()
    assert missing.id == "batchdesk.E003" and "cannot be read" in missing.msg
    settings.BATCHDESK_CURRENCY = "pounds"
    [currency] = check_rate_file()
    assert currency.id == "batchdesk.E002"


def test_a_rate_file_that_turns_bad_while_running_keeps_its_last_good_rates(rate_file):
    assert rate_on(date(2026, 12, 2)).per_usd == Decimal("0.7890")

    rate_file.write_text('{"source": "half written", "per_usd": {"2026-12-')

    assert rate_on(date(2026, 12, 2)).per_usd == Decimal("0.7890")
    rate_file.write_text(json.dumps({"source": "new", "per_usd": {"2026-12-02": "0.8"}}))
    assert rate_on(date(2026, 12, 2)).per_usd == Decimal("0.8")

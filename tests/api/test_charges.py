"""A job's receipts (SPEC §6 `GET /api/jobs/{id}/charges`): one settled unit a row, with what it was
charged as it was kept; the amounts add up to the job's cost exactly."""

import json
from decimal import Decimal

import pytest

from ledger.models import GeneratedVersion, Item, Submission, SubmissionItem, UnitCharge
from ledger.money import budgets
from ledger.money.pricing import job_cost, price_for
from ledger.states import ItemState
from tests.api.conftest import ApiClient, assert_error, token_for
from tests.exported_jobs import RATE, SOURCE
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

RECEIPT_KEYS = {
    "submission",
    "provider_ref",
    "settled_at",
    "input_tokens",
    "output_tokens",
    "provider_amount",
    "provider_currency",
    "rate",
    "rate_date",
    "rate_source",
    "amount",
}


def charges(user, job, **query) -> dict:
    response = ApiClient(token_for(user)).get(f"/api/jobs/{job.pk}/charges", query)
    assert response.status_code == 200, response.content
    return response.json()


def every_page(user, job) -> tuple[dict, list[dict]]:
    """The first page, and the receipts of every page, following `next`."""
    client = ApiClient(token_for(user))
    first = body = client.get(f"/api/jobs/{job.pk}/charges").json()
    rows = list(body["results"])
    while body["next"]:
        body = client.get(body["next"]).json()
        assert body["total"] == first["total"] and body["count"] == first["count"]
        rows += body["results"]
    return first, rows


def settle_unit(job, versions, key: str) -> UnitCharge:
    """The versions' unit, reserved, then settled by the ledger at the rate in force now."""
    unit = Submission.objects.create(
        job=job, provider=job.provider, model=job.model, intent_key=key, provider_ref=f"batch_{key}"
    )
    UnitCharge.objects.create(job=job, submission=unit, currency="GBP", reserved_usd=Decimal(1))
    for version in versions:
        SubmissionItem.objects.create(submission=unit, item=version.item, custom_id=version.custom_id)
        GeneratedVersion.objects.filter(pk=version.pk).update(submission=unit)
    budgets.settle(unit)
    return UnitCharge.objects.get(submission=unit)


@pytest.fixture
def odd_prices(settings, tmp_path):
    """Prices whose products round at the ledger's sixth decimal place, and pounds."""
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "openai": {
                    "models": {"gpt-4o-mini": {"input_per_million": "0.37", "output_per_million": "1.13"}}
                }
            }
        )
    )
    settings.BATCHDESK_PRICE_FILE = str(prices)
    settings.BATCHDESK_CURRENCY = "GBP"


def rate_file(settings, tmp_path, name: str, per_usd: str) -> None:
    path = tmp_path / f"rates-{name}.json"
    path.write_text(json.dumps({"source": f"bank {name}", "per_usd": {"2020-01-01": per_usd}}))
    settings.BATCHDESK_FX_FILE = str(path)


def test_a_worked_jobs_receipt_is_its_unit_as_kept(owner, worked_job):
    job, _items = worked_job
    charge = UnitCharge.objects.get(job=job)
    body = charges(owner, job)

    assert {"results", "count", "next", "total", "currency"} <= set(body)
    [row] = body["results"]
    assert RECEIPT_KEYS <= set(row)
    assert row["submission"] == charge.submission_id
    assert row["provider_ref"] == charge.submission.provider_ref != ""
    assert (
        (row["input_tokens"], row["output_tokens"]) == (charge.input_tokens, charge.output_tokens) != (0, 0)
    )
    assert (Decimal(row["provider_amount"]), row["provider_currency"]) == (charge.cost_usd, "USD")
    assert (Decimal(row["rate"]), row["rate_date"], row["rate_source"]) == (RATE, "2020-01-01", SOURCE)
    assert Decimal(row["amount"]) == charge.cost and row["currency"] == "GBP" and row["note"] == ""
    assert row["settled_at"].endswith("Z")
    # Every unit that ran is settled: the receipts are the job's whole cost.
    cost = ApiClient(token_for(owner)).get(f"/api/jobs/{job.pk}").json()["cost"]
    assert (body["count"], body["next"], body["currency"]) == (1, None, "GBP")
    assert body["total"] == row["amount"] == cost["total"] and Decimal(body["unsettled"]) == 0


def test_receipts_at_several_rates_add_up_to_the_jobs_cost_exactly_over_every_page(
    owner, odd_prices, settings, tmp_path, monkeypatch
):
    monkeypatch.setattr("review.api.charges.RECEIPTS_PER_PAGE", 3)
    job = JobFactory(owner=owner)
    versions = []
    for n in range(8):
        item = ItemFactory(job=job, awaiting_review=True)
        version = add_version(item)
        GeneratedVersion.objects.filter(pk=version.pk).update(
            input_tokens=117 + 13 * n, output_tokens=59 + 7 * n
        )
        versions.append(version)
    rates = ["0.7913", "0.80017", "1.2345"]
    for n, version in enumerate(versions[:7]):
        rate_file(settings, tmp_path, str(n % 3), rates[n % 3])
        settle_unit(job, [version], f"unit_{n}")
    # The last draft's unit has not settled: it counts at today's rate, the last file's (0.7913).
    first, rows = every_page(owner, job)

    kept = list(UnitCharge.objects.filter(job=job).order_by("settled_at", "pk"))
    assert [row["submission"] for row in rows] == [charge.submission_id for charge in kept]
    assert first["count"] == 7 and len(rows) == 7 and first["currency"] == "GBP"
    assert [Decimal(row["amount"]) for row in rows] == [charge.cost for charge in kept]
    assert sorted({row["rate"] for row in rows}) == ["0.79130000", "0.80017000", "1.23450000"]
    total = sum(Decimal(row["amount"]) for row in rows)
    assert Decimal(first["total"]) == total
    price = price_for(job.provider, job.model)
    waiting = price.cost(117 + 13 * 7, 59 + 7 * 7) * Decimal("0.7913")
    assert Decimal(first["unsettled"]) == waiting.quantize(Decimal("0.000001"))
    cost = job_cost(job)
    assert cost["total"] == total + Decimal(first["unsettled"]) == Decimal(first["job_total"])
    assert cost["approved"] + cost["pending"] + cost["wasted"] == cost["total"]
    assert cost["settled"] == total and cost["currency"] == "GBP"
    # The API's job says the same.
    assert (
        Decimal(ApiClient(token_for(owner)).get(f"/api/jobs/{job.pk}").json()["cost"]["total"])
        == cost["total"]
    )


def test_once_everything_settled_the_receipts_are_the_jobs_cost(owner, odd_prices, settings, tmp_path):
    job = JobFactory(owner=owner)
    for n in range(5):
        item = ItemFactory(job=job, state=ItemState.REJECTED if n % 2 else ItemState.AWAITING_REVIEW)
        version = add_version(item)
        GeneratedVersion.objects.filter(pk=version.pk).update(input_tokens=1001 + n, output_tokens=333 + n)
        rate_file(settings, tmp_path, str(n), f"0.78{n}1")
        settle_unit(job, [version], f"unit_{n}")
    approved = job.items.filter(state=ItemState.AWAITING_REVIEW).first()
    Item.objects.filter(pk=approved.pk).update(approved_version=approved.versions.get())
    body = charges(owner, job)
    cost = job_cost(job)
    assert Decimal(body["total"]) == sum(Decimal(r["amount"]) for r in body["results"]) == cost["total"]
    assert cost["total"] == sum(c.cost for c in UnitCharge.objects.filter(job=job))
    assert cost["approved"] + cost["pending"] + cost["wasted"] == cost["total"]
    assert Decimal(body["unsettled"]) == 0


def test_a_job_with_no_settled_unit_has_no_receipts(owner, pounds):
    job = JobFactory(owner=owner)
    add_version(ItemFactory(job=job, awaiting_review=True))  # a draft whose unit has not settled
    body = charges(owner, job)
    assert body["results"] == [] and (body["count"], body["next"]) == (0, None)
    assert Decimal(body["total"]) == 0 and body["currency"] == "GBP"
    assert Decimal(body["unsettled"]) == Decimal(body["job_total"]) > 0


def test_a_unit_settled_with_no_rate_makes_the_receipts_dollars_and_says_so(owner, settings, tmp_path):
    settings.BATCHDESK_CURRENCY = "GBP"
    settings.BATCHDESK_FX_FILE = ""
    job = JobFactory(owner=owner)
    first, second = (add_version(ItemFactory(job=job, awaiting_review=True)) for _ in range(2))
    no_rate = settle_unit(job, [first], "no_rate")
    rate_file(settings, tmp_path, "later", "0.79")
    with_rate = settle_unit(job, [second], "with_rate")
    assert no_rate.cost is None and with_rate.cost is not None

    body = charges(owner, job)
    assert body["currency"] == "USD" and "1 of its units settled with no rate from USD to GBP" in body["note"]
    rows = {row["submission"]: row for row in body["results"]}
    assert Decimal(rows[no_rate.submission_id]["amount"]) == no_rate.cost_usd
    assert "no rate from USD to GBP was in force" in rows[no_rate.submission_id]["note"]
    # A unit that kept a rate still shows it, its amount in the list's currency.
    assert Decimal(rows[with_rate.submission_id]["rate"]) == Decimal("0.79")
    assert Decimal(rows[with_rate.submission_id]["amount"]) == with_rate.cost_usd
    total = no_rate.cost_usd + with_rate.cost_usd
    assert Decimal(body["total"]) == total == job_cost(job)["total"]


@pytest.mark.parametrize("role", ["catalogue_owner", "operator", "admin"])
def test_whoever_may_read_a_job_may_read_its_receipts(role):
    job = JobFactory()
    assert charges(UserFactory(roles=[role]), job)["count"] == 0


def test_receipts_refuse_strangers_and_unknown_jobs(client, owner, outsider):
    job = JobFactory()
    client.force_login(outsider)  # a session opens nothing under /api/
    assert_error(client.get(f"/api/jobs/{job.pk}/charges"), 401, "unauthenticated")
    assert_error(ApiClient(token_for(outsider)).get(f"/api/jobs/{job.pk}/charges"), 403, "forbidden")
    as_owner = ApiClient(token_for(owner))
    assert_error(as_owner.get("/api/jobs/987654321/charges"), 404, "not_found")
    assert_error(as_owner.get(f"/api/jobs/{job.pk}/charges", {"page": "nonsense"}), 400, "invalid", {"page"})
    assert_error(as_owner.post_json(f"/api/jobs/{job.pk}/charges", {}), 405)

"""A job's receipts on its page and as a CSV for the finance team (`/jobs/{id}/receipts.csv`): one
settled unit a row, the total the job's cost is made of (the API's: tests/api/test_charges.py)."""

import re
from decimal import Decimal

import pytest
from django.urls import reverse

from ledger.models import Submission, UnitCharge
from ledger.money.pricing import job_cost
from review.receipts import CSV_COLUMNS
from tests.exported_jobs import RATE, SOURCE, csv_rows, streamed
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_job_page_shows_each_settled_unit_and_the_total(client, owner, worked_job):
    job, _items = worked_job
    charge = UnitCharge.objects.select_related("submission").get(job=job)
    client.force_login(owner)
    response = client.get(reverse("job_detail", args=[job.pk]))
    html = response.content.decode()
    assert 'data-testid="receipts"' in html
    row = html.split(f'data-testid="receipt-{charge.submission_id}"')[1].split("</tr>")[0]
    assert charge.submission.provider_ref in row
    assert f'<td class="num">{charge.input_tokens}</td>' in row
    assert f'<td class="num">{charge.output_tokens}</td>' in row
    assert f"{RATE.normalize()} GBP per USD" in row and f"(2020-01-01, {SOURCE})" in row
    # Amounts under a penny keep the digits that tell them apart, the exact amount in the title.
    assert f'title="{charge.cost} GBP"' in row and "&lt;" not in row
    assert f'title="{charge.cost_usd} USD"' in row
    receipts = response.context["receipts"]
    assert receipts["total"] == charge.cost == job_cost(job)["total"] and receipts["count"] == 1
    assert f'href="{reverse("job_receipts_csv", args=[job.pk])}"' in html


def test_many_receipts_show_the_first_and_the_csv_has_them_all(client, owner, pounds, monkeypatch):
    monkeypatch.setattr("review.receipts.RECEIPTS_SHOWN", 2)
    job = JobFactory(owner=owner)
    for n in range(3):
        unit = Submission.objects.create(
            job=job, provider=job.provider, model=job.model, intent_key=f"bd_r{n}", provider_ref=f"batch_{n}"
        )
        UnitCharge.objects.create(
            job=job,
            submission=unit,
            currency="GBP",
            reserved_usd=Decimal(1),
            cost_usd=Decimal("0.000100"),
            cost=Decimal("0.000079"),
            rate=RATE,
            rate_date="2020-01-01",
            rate_source=SOURCE,
            settled_at=f"2026-12-0{n + 1}T10:00:00Z",
        )
    client.force_login(owner)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert len(re.findall(r'data-testid="receipt-\d+"', html)) == 2
    assert "The first 2 are shown; the CSV has all 3." in html
    assert 'data-testid="receipts-total"><span class="money" title="0.000237 GBP">£0.00024</span>' in html
    rows = csv_rows(streamed(client.get(reverse("job_receipts_csv", args=[job.pk]))))
    assert [row["provider_ref"] for row in rows] == ["batch_0", "batch_1", "batch_2"]
    assert sum(Decimal(row["amount"]) for row in rows) == Decimal("0.000237")


def test_the_csv_is_the_apis_rows_with_formulas_neutralised(client, owner, worked_job):
    job, _items = worked_job
    charge = UnitCharge.objects.get(job=job)
    Submission.objects.filter(pk=charge.submission_id).update(
        provider_ref='=HYPERLINK("http://evil.example")'
    )
    client.force_login(owner)
    response = client.get(reverse("job_receipts_csv", args=[job.pk]))
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert (
        response["Content-Disposition"] == f'attachment; filename="receipts-job-{job.pk}-{job.reference}.csv"'
    )
    [row] = csv_rows(streamed(response))
    assert list(row) == list(CSV_COLUMNS)
    assert row["provider_ref"] == '\'=HYPERLINK("http://evil.example")'
    assert (Decimal(row["amount"]), row["currency"]) == (charge.cost, "GBP")
    assert (Decimal(row["provider_amount"]), row["provider_currency"]) == (charge.cost_usd, "USD")
    assert (Decimal(row["rate"]), row["rate_currency"], row["rate_date"], row["rate_source"]) == (
        RATE,
        "GBP",
        "2020-01-01",
        SOURCE,
    )
    assert row["settled_at"].endswith("Z") and int(row["input_tokens"]) == charge.input_tokens


def test_the_csv_asks_strangers_to_log_in_and_refuses_people_without_a_role(client, outsider, owner):
    job = JobFactory()
    url = reverse("job_receipts_csv", args=[job.pk])
    response = client.get(url)
    assert response.status_code == 302 and reverse("login") in response.url
    client.force_login(outsider)
    assert client.get(url).status_code == 403
    client.force_login(owner)
    assert csv_rows(streamed(client.get(url))) == []
    assert client.get("/jobs/987654321/receipts.csv").status_code == 404


def test_a_job_with_nothing_settled_says_so(client, owner):
    job = JobFactory(owner=owner)
    client.force_login(owner)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert "No batch has settled yet." in html and "Download receipts (CSV)" in html

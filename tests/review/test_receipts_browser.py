"""The job page's receipts in a browser at a phone's width: each settled batch with its provider
reference, tokens, amounts and rate, the total the job's cost is made of, and the CSV download."""

import csv
from decimal import Decimal

import pytest
from django.urls import reverse

from ledger.actions.job_states import refresh_job_state
from ledger.models import UnitCharge
from ledger.money.pricing import job_cost
from tests.exported_jobs import RATE, SOURCE
from tests.review.browser import log_in
from tests.review.test_narrow_screens import OVERFLOWING, PHONE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_receipts_table_and_its_csv(page, live_server, owner, worked_job):
    job, _items = worked_job
    refresh_job_state(job.pk)  # in review: the page neither polls nor streams
    charge = UnitCharge.objects.select_related("submission").get(job=job)
    page.set_viewport_size(PHONE)
    log_in(page, live_server, owner, then=reverse("job_detail", args=[job.pk]))

    assert page.evaluate(OVERFLOWING) == []  # the receipts table scrolls inside its box
    receipts = page.get_by_test_id("receipts")
    row = receipts.get_by_test_id(f"receipt-{charge.submission_id}")
    row.scroll_into_view_if_needed()
    assert row.is_visible()
    assert charge.submission.provider_ref in row.inner_text()
    assert (
        row.get_by_test_id("receipt-rate").inner_text()
        == f"{RATE.normalize()} GBP per USD (2020-01-01, {SOURCE})"
    )
    # Under a penny: the digits that tell it apart, never "< £0.01"; the exact amount in the title.
    amount = row.get_by_test_id("receipt-amount").locator(".money")
    assert amount.get_attribute("title") == f"{charge.cost} GBP"
    assert amount.inner_text().startswith("£0.0") and "<" not in amount.inner_text()
    total = receipts.get_by_test_id("receipts-total").locator(".money")
    assert total.get_attribute("title") == f"{job_cost(job)['total']} GBP"

    button = page.get_by_role("link", name="Download receipts (CSV)")
    box = button.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390
    with page.expect_download() as download:
        button.click()
    assert download.value.suggested_filename == f"receipts-job-{job.pk}-{job.reference}.csv"
    with open(download.value.path(), encoding="utf-8-sig", newline="") as exported:
        rows = list(csv.DictReader(exported))
    assert [(row["provider_ref"], Decimal(row["amount"]), row["currency"]) for row in rows] == [
        (charge.submission.provider_ref, charge.cost, "GBP")
    ]
    assert sum(Decimal(row["amount"]) for row in rows) == job_cost(job)["total"]

"""The job page's export buttons, in a browser at a phone's width: each downloads the job's items."""

import csv
import json

import pytest
from django.urls import reverse

from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version
from tests.review.browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_export_buttons_download_the_jobs_items(page, live_server):
    job = JobFactory(reference='spring/2027 "catalogue"')
    waiting = ItemFactory(job=job, awaiting_review=True)
    add_version(waiting)
    rejected = ItemFactory(job=job, state=ItemState.REJECTED, reason="=1+1 is not a description")
    operator = UserFactory(roles=["operator"])
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_server, operator, then=reverse("job_detail", args=[job.pk]))

    csv_button = page.get_by_role("link", name="Export CSV")
    box = csv_button.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390
    with page.expect_download() as download:
        csv_button.click()
    assert download.value.suggested_filename == f"job-{job.pk}-spring_2027_catalogue.csv"
    with open(download.value.path(), encoding="utf-8-sig", newline="") as exported:
        rows = list(csv.DictReader(exported))
    assert [(r["item_id"], r["state"]) for r in rows] == [
        (str(waiting.pk), "awaiting_review"),
        (str(rejected.pk), "rejected"),
    ]
    assert rows[1]["reason"] == "'=1+1 is not a description"

    with page.expect_download() as download:
        page.get_by_role("link", name="Export JSONL").click()
    with open(download.value.path(), encoding="utf-8") as exported:
        rows = [json.loads(line) for line in exported]
    assert [row["sku"] for row in rows] == [waiting.product.sku, rejected.product.sku]
    assert rows[1]["reason"] == "=1+1 is not a description"

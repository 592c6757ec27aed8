"""A pilot through the whole pipeline in real processes (issue 19, point 1): started through the API,
its sample sent to the OpenAI Batch emulator by a django-q2 worker cluster, its drafts reviewed, the
approved ones published; then its report (point 3). Nothing is mocked."""

from decimal import Decimal

import pytest
from django_q.tasks import async_task

from ledger.actions.products import record_product
from ledger.actions.reviewing import approve_version, reject_version
from ledger.models import Item, Job, PilotProduct, Product
from ledger.states import ItemState
from tests.api.conftest import ApiClient, token_for
from tests.factories import UserFactory
from tests.processes import wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

SETTLED = {
    ItemState.AWAITING_REVIEW,
    ItemState.VALIDATION_FAILED,
    ItemState.INFERENCE_FAILED,
    ItemState.DEAD_LETTER,
}


def test_a_pilot_runs_through_the_pipeline_to_published_text_and_its_report(processes):
    processes.emulator("--per-request-ms", "5", "--fail-rate", "0.1", "--seed", "5")
    owner = UserFactory(roles=["catalogue_owner"])
    for n in range(30):
        category = ("kitchen", "garden", "bath")[n % 3]
        record_product(
            sku=f"PIL-{n:03d}",
            title=f"Oak {category} board no. {n}",
            fields={"category": category, "material": "oak", "dimensions": f"{30 + n} x 20 cm"},
        )
    api = ApiClient(token_for(owner))
    processes.start("qcluster")

    body = {
        "reference": "pilot-pipeline",
        "task": "product_description",
        "provider": "emulator",
        "unit_size": 4,
        "pilot": {"per_stratum": 3, "strata": ["category"], "seed": 2026},
    }
    started = api.post_json("/api/jobs", body)
    assert started.status_code == 202, started.content
    job = Job.objects.get(pk=started.json()["id"])
    async_task("ledger.tasks.collect_round")
    sampled = set(PilotProduct.objects.filter(pilot__job=job).values_list("product__sku", flat=True))
    assert len(sampled) == 9

    def settled():
        states = set(Item.objects.filter(job=job).values_list("state", flat=True))
        return states <= SETTLED and states

    wait_until(settled, timeout=180, what="the pilot's items to settle")
    # Not enough decided yet: the report says how many decisions it needs.
    waiting = Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW)
    assert waiting.exists()
    refused = api.get(f"/api/jobs/{job.pk}/pilot")
    assert refused.status_code == 409 and refused.json()["decisions"]["needed"] == waiting.count()

    first, *others = waiting.order_by("id")
    reject_version(item_id=first.pk, version_id=first.versions.get().pk, reviewer=owner, reason="Too plain")
    for item in others:
        version = item.versions.get()
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
    wait_until(
        lambda: not Item.objects.filter(job=job, state__in=[ItemState.APPROVED, ItemState.APPLYING]).exists(),
        timeout=60,
        what="approved drafts to be published",
    )

    applied = Item.objects.filter(job=job, state=ItemState.APPLIED)
    assert applied.count() == len(others)
    published = set(Product.objects.exclude(published_content="").values_list("sku", flat=True))
    assert published == set(applied.values_list("product__sku", flat=True)) and published <= sampled

    response = api.get(f"/api/jobs/{job.pk}/pilot")
    assert response.status_code == 200, response.content
    report = response.json()
    assert [(s["key"], s["scope_products"], s["products"]) for s in report["sample"]["strata"]] == [
        ("category bath", 10, 3),
        ("category garden", 10, 3),
        ("category kitchen", 10, 3),
    ]
    measured = report["measured"]
    assert measured["decisions"] == len(others) + 1 and measured["rejections"] == 1
    assert measured["tokens_in_per_item"] > 0 and measured["cost_per_item"] is not None
    projection = report["projection"]
    assert projection["scope_items"] == 30
    cost = {end: Decimal(projection["cost"][end]) for end in ("low", "expected", "high")}
    assert 0 < cost["low"] <= cost["expected"] <= cost["high"]
    assert projection["provider_hours"] is not None  # the pilot's own units were timed

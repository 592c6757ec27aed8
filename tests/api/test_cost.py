"""The price table and what a job's drafts cost (SPEC §9)."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import GeneratedVersion, Item
from ledger.pricing import FALLBACK, PRICES, job_cost, jobs_cost, price_for, total_spend, version_cost
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory, add_version

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "provider, model, expected",
    [
        ("openai", "gpt-4o-mini", PRICES["openai"]["gpt-4o-mini"]),
        ("openai", "gpt-4o-mini-2024-07-18", PRICES["openai"]["gpt-4o-mini"]),
        ("openai", "gpt-4o-2024-08-06", PRICES["openai"]["gpt-4o"]),
        ("emulator", "gpt-4o", PRICES["openai"]["gpt-4o"]),
        ("emulator", "emulated-model", FALLBACK),
        ("anthropic", "claude-sonnet-4-20250514", PRICES["anthropic"]["claude-sonnet-4"]),
    ],
)
def test_the_price_of_a_model(provider, model, expected):
    assert price_for(provider, model) == expected


def test_a_version_costs_its_tokens_at_the_batch_discount():
    version = add_version(ItemFactory(job=JobFactory(model="gpt-4o"), awaiting_review=True))
    # 120 input and 60 output tokens at 2.50 and 10.00 per million, halved.
    assert version_cost(version) == Decimal("0.000450")


def test_a_jobs_spend_is_split_into_approved_pending_and_wasted():
    job = JobFactory()
    approved = ItemFactory(job=job, approved=True)
    Item.objects.filter(pk=approved.pk).update(approved_version=add_version(approved))
    regenerated = ItemFactory(job=job, awaiting_review=True)
    add_version(regenerated)  # replaced by the next one: wasted
    add_version(regenerated)  # to be decided on: pending
    add_version(ItemFactory(job=job, state=ItemState.REJECTED))
    obsolete = ItemFactory(job=job, state=ItemState.OBSOLETE)
    Item.objects.filter(pk=obsolete.pk).update(approved_version=add_version(obsolete))
    ItemFactory(job=JobFactory())  # another job's
    # A million of each: (0.15 + 0.60) / 2 = 0.375 a version.
    GeneratedVersion.objects.update(input_tokens=1_000_000, output_tokens=1_000_000)
    cost = job_cost(job)
    assert {
        k: cost[k] for k in ("total", "approved", "pending", "wasted", "per_item", "per_approved_draft")
    } == {
        "total": Decimal("1.875"),
        "approved": Decimal("0.375"),
        "pending": Decimal("0.375"),
        "wasted": Decimal("1.125"),
        "per_item": Decimal("0.46875"),
        "per_approved_draft": Decimal("1.875"),
    }
    assert total_spend() == Decimal("1.875")


def test_a_job_without_drafts_costs_nothing():
    job = JobFactory()
    cost = job_cost(job)
    assert cost["total"] == cost["wasted"] == Decimal(0)
    assert cost["per_item"] is None and cost["per_approved_draft"] is None


def test_costs_take_the_same_queries_however_many_jobs_and_versions():
    jobs = JobFactory.create_batch(3)
    for job in jobs:
        for _ in range(3):
            add_version(ItemFactory(job=job, awaiting_review=True))
    with CaptureQueriesContext(connection) as queries:
        costs = jobs_cost([job.pk for job in jobs])
    assert len(queries) == 2 and set(costs) == {job.pk for job in jobs}

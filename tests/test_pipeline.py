"""The whole pipeline in real processes: an emulator speaking OpenAI's Batch protocol over HTTP,
a django-q2 worker cluster, and PostgreSQL. Nothing is mocked."""

import pytest
from django_q.tasks import async_task

from ledger.actions.core import NotAllowed
from ledger.actions.jobs import create_job
from ledger.actions.reviewing import approve_version
from ledger.models import Approval, Event, GeneratedVersion, Item, Product, Submission, SubmissionItem
from ledger.states import FINAL_STATES, OPERATOR_STATES, ItemState, JobState
from tests.factories import UserFactory
from tests.processes import emulator_stats, make_catalogue, wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

SETTLED = {
    ItemState.AWAITING_REVIEW,
    ItemState.VALIDATION_FAILED,
    ItemState.INFERENCE_FAILED,
    ItemState.DEAD_LETTER,
    *FINAL_STATES,
}


def test_catalogue_to_published_text_through_real_processes(processes):
    emulator_url = processes.emulator(
        "--per-request-ms", "5", "--fail-rate", "0.15", "--expire-rate", "0.1", "--seed", "11"
    )
    owner = UserFactory(roles=["catalogue_owner"])
    skus = make_catalogue(40)

    processes.start("qcluster")
    job = create_job(
        reference="pipeline",
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        unit_size=8,
    )
    async_task("ledger.tasks.collect_round")  # rather than wait for the schedule's first round

    # Rule 1 holds at every moment we look, not only at the end.
    def settled():
        counts = job.items.counts_by_state()
        assert sum(counts.values()) == len(skus)
        return set(counts) <= SETTLED and counts

    counts = wait_until(settled, timeout=240, what="every item to settle")

    stats = emulator_stats(emulator_url)
    # Work that succeeded is never paid for twice: no custom_id was ever inferred twice.
    assert stats["inferences"] and max(stats["inferences"].values()) == 1
    assert Submission.objects.filter(job=job).count() >= len(skus) // 8
    # Failures and expiries happened, and each failed item was retried as its own new request.
    retried = Item.objects.filter(job=job, inference_attempt__gt=1)
    assert retried.exists()
    sent = set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))
    # Each attempt was sent exactly once, and the provider only ever saw what the ledger sent.
    assert len(sent) == sum(i.inference_attempt for i in Item.objects.filter(job=job))
    assert set(stats["inferences"]) <= sent
    assert not SubmissionItem.objects.filter(item__job=job, outcome="").exists()
    for item in Item.objects.filter(job=job):
        assert item.versions.count() <= 1
        if item.state == ItemState.AWAITING_REVIEW:
            assert item.versions.get().valid is True
        elif item.state == ItemState.DEAD_LETTER:
            assert "Gave up after" in item.reason
    assert counts.get(ItemState.AWAITING_REVIEW, 0) >= len(skus) // 2

    # A reviewer approves every valid draft; the worker applies them.
    withdrawn_sku = Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).first().product.sku
    Product.objects.filter(sku=withdrawn_sku).update(status="withdrawn")
    for item in Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW):
        version = item.versions.get()
        try:
            approve_version(
                item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
            )
        except NotAllowed:
            assert item.product.sku == withdrawn_sku

    wait_until(
        lambda: not Item.objects.filter(job=job, state__in=[ItemState.APPROVED, ItemState.APPLYING]).exists(),
        timeout=60,
        what="approved drafts to be applied",
    )
    applied = Item.objects.filter(job=job, state=ItemState.APPLIED)
    assert applied.count() == Approval.objects.filter(item__job=job).count() > 0
    for item in applied.select_related("product", "approved_version"):
        assert item.product.published_content == item.approved_version.content
        assert item.product.published_version_id == item.approved_version_id
    assert Item.objects.get(job=job, product__sku=withdrawn_sku).state == ItemState.WITHDRAWN
    assert Product.objects.get(sku=withdrawn_sku).published_content == ""

    final_counts = job.items.counts_by_state()
    assert sum(final_counts.values()) == Item.objects.filter(job=job).count()
    # Every item's last event names the state it is in.
    for item in Item.objects.filter(job=job):
        assert Event.objects.filter(item=item).order_by("id").last().to_state == item.state
    assert (
        GeneratedVersion.objects.filter(item__job=job).count()
        == SubmissionItem.objects.filter(item__job=job, outcome="returned").count()
    )
    job.refresh_from_db()
    # Nothing in flight: an item waiting for an operator (a dead letter, say) keeps the job from completed.
    if set(job.items.counts_by_state()) & set(OPERATOR_STATES):
        assert job.state in {JobState.IN_REVIEW, JobState.NEEDS_ATTENTION}
    else:
        assert job.state in {JobState.IN_REVIEW, JobState.COMPLETED}

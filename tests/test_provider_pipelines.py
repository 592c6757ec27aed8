"""One whole pipeline per wire protocol, through real processes: the provider's emulator started as
`run_emulator --protocol`, a django-q2 worker cluster and PostgreSQL. A catalogue, a job created
through the ledger's verbs, every item settled through the provider's faults, a reviewer's
approvals, and the drafts applied to the `catalogue` destination. Nothing is mocked.

Sequences are reset, so the custom_ids (`bd-<item>-<attempt>`) and therefore the emulator's seeded
faults are the same on every run: seed 11 fails some requests of every provider and expires
some where the protocol has expiry."""

import pytest
from django_q.tasks import async_task

from ledger.actions.jobs import create_job
from ledger.actions.reviewing import approve_version
from ledger.models import Approval, Event, GeneratedVersion, Item, Product, Submission, SubmissionItem
from ledger.providers.base import Delivery
from ledger.states import FINAL_STATES, OPERATOR_STATES, ItemState, JobState
from tests.factories import UserFactory
from tests.processes import emulator_stats, make_catalogue, wait_until
from tests.provider_emulators import ONE_PER_PROTOCOL
from tests.worker_checks import units_at_provider

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True, reset_sequences=True)]

SETTLED = {
    ItemState.AWAITING_REVIEW,
    ItemState.VALIDATION_FAILED,
    ItemState.INFERENCE_FAILED,
    ItemState.DEAD_LETTER,
    *FINAL_STATES,
}
N_PRODUCTS, UNIT_SIZE, SEED = 12, 4, 11
FAIL_RATE = "0.25"
# Expiry, by wire protocol, where it exists. OpenAI and Anthropic expire requests a batch has not
# run in time (the others' results are kept); Gemini expires the whole batch, with no results.
# Cloudflare documents none (queued requests are "fulfilled eventually"), and a synchronous
# server answers now or never: nothing waits long enough to expire.
EXPIRY = {
    "openai": ["--expire-rate", "0.1"],
    "anthropic": ["--expire-rate", "0.1"],
    "gemini": ["--expire-rate", "0.34"],
}


@pytest.mark.parametrize("provider", ONE_PER_PROTOCOL, ids=str)
def test_catalogue_to_published_text_for_every_provider(processes, provider):
    expiry = EXPIRY.get(provider.protocol, [])
    emulator_url = processes.emulator(
        "--per-request-ms", "5", "--fail-rate", FAIL_RATE, *expiry, "--seed", str(SEED), provider=provider
    )
    owner = UserFactory(roles=["catalogue_owner"])
    skus = make_catalogue(N_PRODUCTS)
    processes.start("qcluster")
    job = create_job(
        reference=f"pipeline-{provider.name}",
        owner=owner,
        task="product_description",
        provider=provider.name,
        model=provider.model,
        unit_size=UNIT_SIZE,
    )
    async_task("ledger.tasks.collect_round")

    # Rule 1 holds at every moment we look, not only at the end.
    def settled():
        counts = job.items.counts_by_state()
        assert sum(counts.values()) == len(skus)
        return set(counts) <= SETTLED and counts

    counts = wait_until(settled, timeout=120, what="every item to settle")

    stats = emulator_stats(emulator_url)
    # Work that succeeded is never paid for twice: no custom_id was ever inferred twice.
    assert stats["inferences"] and max(stats["inferences"].values()) == 1
    # The first units, then the retries (a unit of their own, or several retries together).
    assert Submission.objects.filter(job=job).count() > N_PRODUCTS // UNIT_SIZE
    sent = set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))
    # Each attempt was sent exactly once, and the provider only ever saw what the ledger sent.
    assert len(sent) == sum(i.inference_attempt for i in Item.objects.filter(job=job))
    assert set(stats["inferences"]) <= sent
    assert not SubmissionItem.objects.filter(item__job=job, outcome="").exists()
    # Every unit the provider holds is one the ledger knows (a synchronous server holds none).
    held = units_at_provider(stats, provider)
    assert held is None or held == Submission.objects.filter(job=job).exclude(provider_ref="").count()
    if provider.capabilities.delivery != Delivery.PER_REQUEST:
        # Counts were read and agreed with the lines (no anomaly other than what the knobs made).
        assert not any(s.anomalies for s in Submission.objects.filter(job=job))

    # Failures and expiries happened; each was transient and retried as its own new request.
    failed = Event.objects.filter(item__job=job, to_state=ItemState.INFERENCE_FAILED)
    assert failed.exists()
    assert all(event.data["transient"] for event in failed)
    assert failed.count() == SubmissionItem.objects.filter(item__job=job, outcome="failed").count()
    if expiry:
        assert any("expired" in event.reason.lower() for event in failed)
    assert Item.objects.filter(job=job, inference_attempt__gt=1).exists()
    for item in Item.objects.filter(job=job):
        assert item.versions.count() <= 1
        if item.state == ItemState.AWAITING_REVIEW:
            assert item.versions.get().valid is True
        elif item.state == ItemState.DEAD_LETTER:
            assert "Gave up after" in item.reason
    assert counts.get(ItemState.AWAITING_REVIEW, 0) >= len(skus) // 2

    # A reviewer approves every valid draft; the worker applies them to the catalogue.
    for item in Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW):
        version = item.versions.get()
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
    wait_until(
        lambda: not Item.objects.filter(job=job, state__in=[ItemState.APPROVED, ItemState.APPLYING]).exists(),
        timeout=60,
        what="approved drafts to be applied",
    )
    applied = Item.objects.filter(job=job, state=ItemState.APPLIED)
    assert (
        applied.count() == Approval.objects.filter(item__job=job).count() == counts[ItemState.AWAITING_REVIEW]
    )
    for item in applied.select_related("product", "approved_version"):
        assert item.product.published_content == item.approved_version.content
        assert item.product.published_version_id == item.approved_version_id
    assert Product.objects.exclude(published_version=None).count() == applied.count()

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

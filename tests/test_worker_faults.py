"""Workers that die, and workers that compete: the ledger, not the queue, is the truth.

Each test runs real `qcluster` processes against a real emulator process and PostgreSQL, and
checks the invariants of SPEC §3: no lost item, no second version, no repeated inference, no
duplicate event sequence, nothing applied twice."""

import zlib

import pytest
from django.db import connection
from django_q.tasks import async_task

from ledger import actions
from ledger.models import (
    DestinationAttempt,
    Event,
    GeneratedVersion,
    Item,
    Product,
    Submission,
    SubmissionItem,
)
from ledger.states import ItemState, SubmissionState
from tests.factories import UserFactory
from tests.processes import emulator_stats, make_catalogue, wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

UNDISTURBED_STORY = ["prepared", "submitted", "returned", "awaiting_review"]


def start_job(n_products: int, unit_size: int):
    owner = UserFactory(roles=["catalogue_owner"])
    make_catalogue(n_products)
    job = actions.create_job(
        reference="faults",
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        unit_size=unit_size,
    )
    return owner, job


def assert_ledger_as_undisturbed(job, emulator_url: str, n_products: int) -> None:
    items = list(Item.objects.filter(job=job))
    # No lost item, none added.
    assert len(items) == n_products
    assert {item.state for item in items} == {ItemState.AWAITING_REVIEW}
    for item in items:
        # No second version, no repeated or missing step in the item's story.
        assert item.versions.count() == 1
        assert list(Event.objects.filter(item=item).order_by("id").values_list("to_state", flat=True)) == (
            UNDISTURBED_STORY
        )
    stats = emulator_stats(emulator_url)
    # Nothing was inferred twice, and every batch the provider holds is one the ledger knows.
    assert set(stats["inferences"]) == set(SubmissionItem.objects.values_list("custom_id", flat=True))
    assert max(stats["inferences"].values()) == 1
    assert stats["batches"] == Submission.objects.exclude(provider_ref="").count()
    assert not Submission.objects.exclude(state=SubmissionState.COLLECTED).exists()


def kill_when(processes, cluster, condition, what: str):
    wait_until(condition, timeout=90, what=what, every=0.05)
    processes.kill(cluster)
    # The queue lost whatever that cluster was doing; a fresh one must finish the work from the ledger.
    restarted = processes.start("qcluster")
    async_task("ledger.tasks.collect_round")
    return restarted


@pytest.mark.parametrize("run", [1])
def test_killing_the_cluster_during_submission_and_collection_loses_and_repeats_nothing(processes, run):
    n_products = 36
    emulator_url = processes.emulator("--per-request-ms", "60", "--seed", str(run))
    _, job = start_job(n_products, unit_size=12)
    cluster = processes.start("qcluster")

    # 1. while submitting: as soon as the first intent exists
    cluster = kill_when(
        processes, cluster, lambda: Submission.objects.filter(job=job).exists(), "the first submission intent"
    )
    # 2. while the provider works: once a submission is open at the provider
    cluster = kill_when(
        processes,
        cluster,
        lambda: Submission.objects.filter(job=job, state=SubmissionState.OPEN).exists(),
        "an open submission",
    )
    # 3. during collection: some results recorded, others not yet
    cluster = kill_when(
        processes,
        cluster,
        lambda: GeneratedVersion.objects.filter(item__job=job).exists(),
        "the first recorded result",
    )

    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n_products,
        timeout=150,
        what="every item to await review after the kills",
    )
    assert_ledger_as_undisturbed(job, emulator_url, n_products)


def test_killing_the_cluster_while_applying_publishes_each_draft_once(processes):
    n_products = 12
    processes.emulator("--per-request-ms", "5")
    owner, job = start_job(n_products, unit_size=12)
    cluster = processes.start("qcluster")
    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n_products,
        timeout=90,
        what="drafts",
    )
    for item in Item.objects.filter(job=job):
        version = item.versions.get()
        actions.approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )

    kill_when(
        processes,
        cluster,
        lambda: Item.objects.filter(job=job, state__in=[ItemState.APPLYING, ItemState.APPLIED]).exists(),
        "the first application",
    )

    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.APPLIED).count() == n_products,
        timeout=90,
        what="every approved draft to be applied",
    )
    for item in Item.objects.filter(job=job).select_related("product"):
        assert item.product.published_version_id == item.approved_version_id
        assert DestinationAttempt.objects.filter(item=item, outcome="applied").count() == 1
        assert Event.objects.filter(item=item, to_state=ItemState.APPLIED).count() == 1


def test_two_clusters_on_redis_submit_and_apply_each_thing_once(processes):
    n_products = 30
    emulator_url = processes.emulator("--per-request-ms", "20")
    # A Redis database of this test database's own, so concurrent test runs never share a queue.
    redis_db = 1 + zlib.crc32(connection.settings_dict["NAME"].encode()) % 15
    redis_env = {"REDIS_URL": f"redis://127.0.0.1:6379/{redis_db}"}
    owner, job = start_job(n_products, unit_size=5)
    for _ in range(2):
        processes.start("qcluster", **redis_env)
    # With Redis the test's own enqueued tasks go nowhere the clusters listen: the collector's
    # schedule alone must find the work in the ledger.
    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n_products,
        timeout=150,
        what="every item to await review",
    )
    assert_ledger_as_undisturbed(job, emulator_url, n_products)

    for item in Item.objects.filter(job=job):
        version = item.versions.get()
        actions.approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.APPLIED).count() == n_products,
        timeout=90,
        what="every approved draft to be applied",
    )
    assert DestinationAttempt.objects.filter(item__job=job).count() == n_products
    assert Product.objects.exclude(published_version=None).count() == n_products


def test_lost_create_answers_are_adopted_by_a_real_worker_never_sent_twice(processes):
    n_products = 20
    emulator_url = processes.emulator("--per-request-ms", "10", "--lose-create", "1,3")
    _, job = start_job(n_products, unit_size=5)
    processes.start("qcluster")

    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n_products,
        timeout=120,
        what="every item to await review",
    )
    stats = emulator_stats(emulator_url)
    assert stats["creates"] == 4
    assert sorted(stats["batches_by_intent"].values()) == [1, 1, 1, 1]
    assert max(stats["inferences"].values()) == 1
    adopted = Submission.objects.filter(job=job, events__to_state=SubmissionState.UNCERTAIN)
    assert adopted.count() == 2
    for item in Item.objects.filter(job=job):
        assert item.versions.count() == 1

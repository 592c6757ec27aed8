"""Workers that die, and workers that compete: the ledger, not the queue, is the truth.

Each test runs real `qcluster` processes against a real emulator process and PostgreSQL, and
checks the invariants of SPEC §3: no lost item, no second version, no repeated inference, no
duplicate event sequence, nothing applied twice. The tests of submitting and collecting run for
every wire protocol, each against its own emulator, and expect of each provider only what its
capabilities allow."""

import time
import zlib
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone
from django_q.tasks import async_task

from ledger.actions.jobs import create_job
from ledger.actions.requests import build_requests
from ledger.actions.reviewing import approve_version
from ledger.actions.submitting import plan_submissions
from ledger.models import (
    DestinationAttempt,
    Event,
    GeneratedVersion,
    Item,
    Product,
    Submission,
    SubmissionItem,
)
from ledger.providers import get_provider
from ledger.providers.base import Delivery, Finding
from ledger.states import ItemState, SubmissionState
from tests.factories import UserFactory
from tests.processes import emulator_stats, make_catalogue, wait_until
from tests.provider_emulators import BY_NAME, ONE_PER_PROTOCOL
from tests.worker_checks import settle, units_at_provider

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

UNDISTURBED_STORY = ["prepared", "submitted", "returned", "awaiting_review"]


def start_job(n_products: int, unit_size: int, provider=BY_NAME["emulator"]):
    owner = UserFactory(roles=["catalogue_owner"])
    make_catalogue(n_products)
    job = create_job(
        reference="faults",
        owner=owner,
        task="product_description",
        provider=provider.name,
        model=provider.model,
        unit_size=unit_size,
    )
    return owner, job


def expected_story(item) -> list[str]:
    """The undisturbed story, with the detour a lost create answer takes where the provider cannot
    be searched by our key: uncertain, then adopted, or prepared again once nothing was found
    (or an operator chose to send it again)."""
    if not Event.objects.filter(item=item, to_state=ItemState.SUBMISSION_UNCERTAIN).exists():
        return UNDISTURBED_STORY
    released = item.submission_entries.filter(outcome="never_received").count()
    return ["prepared", "submission_uncertain", *["prepared"] * released, *UNDISTURBED_STORY[1:]]


def all_reviewable_and_closed(job, n_products: int):
    """Every item awaits review and every unit is collected (or failed). Items can get there first:
    a worker killed between recording a unit's last results and closing it leaves the unit to the
    next worker, once its lease has run out."""

    def done() -> bool:
        return (
            Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n_products
            and not Submission.objects.filter(job=job)
            .exclude(state__in=[SubmissionState.COLLECTED, SubmissionState.FAILED])
            .exists()
        )

    return done


def assert_ledger_as_undisturbed(
    job, emulator_url: str, n_products: int, provider, *, in_flight: "AnswersInFlight | None" = None
) -> None:
    capabilities = provider.capabilities
    items = list(Item.objects.filter(job=job))
    # No lost item, none added.
    assert len(items) == n_products
    assert {item.state for item in items} == {ItemState.AWAITING_REVIEW}
    for item in items:
        # No second version, no repeated or missing step in the item's story.
        assert item.versions.count() == 1
        story = list(Event.objects.filter(item=item).order_by("id").values_list("to_state", flat=True))
        assert story == expected_story(item)
        if story != UNDISTURBED_STORY:
            # A killed worker alone never loses an answer a provider searchable by our key gives.
            assert capabilities.finding != Finding.BY_KEY
    # Every version is the answer to the custom_id its entry records as returned, once.
    returned = SubmissionItem.objects.filter(item__job=job, outcome="returned")
    assert sorted(returned.values_list("custom_id", flat=True)) == sorted(
        GeneratedVersion.objects.filter(item__job=job).values_list("custom_id", flat=True)
    )
    stats = emulator_stats(emulator_url)
    sent = set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))
    inferred = Counter(stats["inferences"])
    # The provider only ever saw what the ledger sent, and ran every request whose answer counts.
    assert set(inferred) <= sent
    assert set(returned.values_list("custom_id", flat=True)) <= set(inferred)
    if in_flight is not None:
        # A synchronous server answers a request in flight when its worker is killed, to nobody;
        # the next worker asks again (the ledger has no answer recorded), so the server runs that
        # custom_id twice. Exactly those, and each is recorded once, with one version (above).
        assert dict(inferred) == in_flight.expected_inferences(sent)
        assert stats["calls_by_custom_id"] == dict(inferred)
    else:
        # Nothing was inferred twice.
        assert max(inferred.values()) == 1
    # Every unit the provider holds is one the ledger knows, but for those an operator chose to
    # send again (the risk of paying twice, taken knowingly) where the provider cannot be searched.
    known = Submission.objects.filter(job=job).exclude(provider_ref="").count()
    held = units_at_provider(stats, provider)
    if held is not None:
        resent = Submission.objects.filter(job=job, entries__outcome="never_received").distinct().count()
        assert known <= held <= known + (resent if capabilities.finding == Finding.NOT_AT_ALL else 0)
    assert (
        not Submission.objects.filter(job=job)
        .exclude(state__in=[SubmissionState.COLLECTED, SubmissionState.FAILED])
        .exists()
    )
    # Only a submission given up as never received failed, and its items were sent again.
    for submission in Submission.objects.filter(job=job, state=SubmissionState.FAILED):
        assert capabilities.finding != Finding.BY_KEY
        assert set(submission.entries.values_list("outcome", flat=True)) == {"never_received"}


def kill_when(processes, cluster, condition, what: str, *, evidence=None):
    wait_until(condition, timeout=90, what=what, every=0.05)
    processes.kill(cluster)
    if evidence is not None:
        evidence()
    # The queue lost whatever that cluster was doing; a fresh one must finish the work from the ledger.
    restarted = processes.start("qcluster")
    async_task("ledger.tasks.collect_round")
    return restarted


class AnswersInFlight:
    """At each kill, before any other worker runs: which requests the server has been asked for
    (`calls_by_custom_id`) whose answer the ledger has not recorded. Their answers went to a dead
    worker; the next one asks again. Expected: each custom_id run once more than it had been
    asked when last killed unrecorded, and every other custom_id run once."""

    def __init__(self, job, emulator_url: str):
        self.job, self.emulator_url = job, emulator_url
        self.asked_unrecorded: dict[str, int] = {}

    def __call__(self) -> None:
        time.sleep(0.3)  # a request the dead worker had written reaches the server meanwhile
        calls = emulator_stats(self.emulator_url)["calls_by_custom_id"]
        recorded = set(
            SubmissionItem.objects.filter(item__job=self.job)
            .exclude(outcome="")
            .values_list("custom_id", flat=True)
        )
        self.asked_unrecorded.update({c: n for c, n in calls.items() if c not in recorded})

    def expected_inferences(self, sent) -> dict[str, int]:
        return {custom_id: 1 + self.asked_unrecorded.get(custom_id, 0) for custom_id in sent}


@pytest.mark.parametrize("provider", ONE_PER_PROTOCOL, ids=str)
def test_killing_the_cluster_during_submission_and_collection_loses_and_repeats_nothing(processes, provider):
    n_products = 36
    emulator_url = processes.emulator("--per-request-ms", "60", "--seed", "1", provider=provider)
    _, job = start_job(n_products, unit_size=12, provider=provider)
    operator = UserFactory(roles=["operator"])
    cluster = processes.start("qcluster")
    in_flight = None
    if provider.capabilities.delivery == Delivery.PER_REQUEST:
        in_flight = AnswersInFlight(job, emulator_url)

    # 1. while submitting: as soon as the first intent exists
    cluster = kill_when(
        processes,
        cluster,
        lambda: Submission.objects.filter(job=job).exists(),
        "the first submission intent",
        evidence=in_flight,
    )
    # 2. while the provider works: once a submission is open at the provider (a synchronous
    # server's unit is open, then ended, at once: it is collected at the next poll)
    cluster = kill_when(
        processes,
        cluster,
        lambda: Submission.objects.filter(job=job).exclude(provider_ref="").exists(),
        "an open submission",
        evidence=in_flight,
    )
    # 3. during collection: some results recorded, others not yet
    cluster = kill_when(
        processes,
        cluster,
        lambda: GeneratedVersion.objects.filter(item__job=job).exists(),
        "the first recorded result",
        evidence=in_flight,
    )

    settle(
        job,
        processes,
        done=all_reviewable_and_closed(job, n_products),
        provider=provider,
        operator=operator,
        timeout=150,
        what="every item to await review and every unit to be closed after the kills",
    )
    assert_ledger_as_undisturbed(job, emulator_url, n_products, provider, in_flight=in_flight)


def test_killing_the_cluster_while_applying_publishes_each_draft_once(processes):
    n_products = 12
    processes.emulator("--per-request-ms", "5")
    owner, job = start_job(n_products, unit_size=12)
    cluster = processes.start("qcluster")
    async_task("ledger.tasks.collect_round")  # rather than wait for the schedule's first round
    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n_products,
        timeout=90,
        what="drafts",
    )
    for item in Item.objects.filter(job=job):
        version = item.versions.get()
        approve_version(
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


def test_two_clusters_on_redis_send_collect_and_apply_each_thing_once(processes):
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
        all_reviewable_and_closed(job, n_products),
        timeout=150,
        what="every item to await review and every unit to be closed",
    )
    assert_ledger_as_undisturbed(job, emulator_url, n_products, BY_NAME["emulator"])
    # Each unit was sent, seen to end and collected once, whichever cluster's worker did it.
    stats = emulator_stats(emulator_url)
    submissions = Submission.objects.filter(job=job)
    assert stats["creates"] == submissions.count() == n_products // 5
    for submission in submissions:
        changes = submission.events.exclude(from_state=F("to_state"))  # not its files deleted
        story = list(changes.order_by("id").values_list("to_state", flat=True))
        assert story == ["intent", "open", "ended", "collected"]

    # The approvals' own tasks go to the database's queue, which no cluster reads: the round
    # finds the approved items and queues their application.
    for item in Item.objects.filter(job=job):
        version = item.versions.get()
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.APPLIED).count() == n_products,
        timeout=90,
        what="every approved draft to be applied",
    )
    assert DestinationAttempt.objects.filter(item__job=job).count() == n_products
    assert Product.objects.exclude(published_version=None).count() == n_products
    for item in Item.objects.filter(job=job):
        story = list(Event.objects.filter(item=item).order_by("id").values_list("to_state", flat=True))
        assert story == [*UNDISTURBED_STORY, "approved", "applying", "applied"]


@pytest.mark.parametrize("provider", ONE_PER_PROTOCOL, ids=str)
def test_lost_create_answers_are_adopted_by_a_real_worker_never_sent_twice(processes, provider):
    """The 1st and 3rd create answers are lost. Each provider's ledger does what its `finding`
    allows: adopts the unit by its key, or by its listing once the candidate's results carry our
    custom_ids; where it cannot look, the items wait for an operator, who sends them again. A
    synchronous server creates nothing: the 1st and 3rd answers it computes are lost instead."""
    n_products = 20
    capabilities = provider.capabilities
    emulator_url = processes.emulator("--per-request-ms", "10", "--lose-create", "1,3", provider=provider)
    _, job = start_job(n_products, unit_size=5, provider=provider)
    operator = UserFactory(roles=["operator"])
    processes.start("qcluster")
    async_task("ledger.tasks.collect_round")

    resent = settle(
        job,
        processes,
        done=lambda: Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n_products,
        provider=provider,
        operator=operator,
        timeout=120,
        what="every item to await review",
    )
    stats = emulator_stats(emulator_url)
    inferred = stats["inferences"]
    assert max(inferred.values()) == 1
    for item in Item.objects.filter(job=job):
        assert item.versions.count() == 1
    uncertain = Submission.objects.filter(job=job, events__to_state=SubmissionState.UNCERTAIN).distinct()
    sent_again = Item.objects.filter(job=job, inference_attempt__gt=1)

    if capabilities.delivery == Delivery.PER_REQUEST:
        # No create to lose: two answers, computed and paid for, never arrived. Each is a transient
        # failure of its own request, sent again under a new custom_id; nothing was uncertain.
        assert stats["creates"] == n_products + 2
        assert not uncertain.exists() and not resent
        assert sent_again.count() == 2
        lost = SubmissionItem.objects.filter(item__job=job, outcome="failed")
        assert lost.count() == 2 and set(lost.values_list("custom_id", flat=True)) <= set(inferred)
        assert len(inferred) == n_products + 2
        return

    # Two submissions went uncertain; nothing was created twice behind the ledger's back.
    assert uncertain.count() == 2
    if capabilities.finding == Finding.NOT_AT_ALL:
        # Nothing to search: both waited for an operator, who sent them again, knowingly paying
        # twice: the lost units ran too, under the custom_ids the ledger gave up as never received.
        assert sorted(resent) == sorted(uncertain.values_list("pk", flat=True))
        assert stats["creates"] == 6 and units_at_provider(stats, provider) == 6
        assert sent_again.count() == 10
        given_up = SubmissionItem.objects.filter(submission__in=uncertain)
        assert set(given_up.values_list("outcome", flat=True)) == {"never_received"}
        assert set(given_up.values_list("custom_id", flat=True)) <= set(inferred)
        return
    # Found again at the provider and adopted: never sent twice.
    assert not resent
    assert stats["creates"] == 4 and units_at_provider(stats, provider) == 4
    assert not sent_again.exists()
    assert set(uncertain.values_list("state", flat=True)) == {SubmissionState.COLLECTED}
    if capabilities.finding == Finding.BY_KEY:
        assert sorted(stats["batches_by_intent"].values()) == [1, 1, 1, 1]
    else:
        # By listing: a candidate was watched, then owned once its results carried our custom_ids.
        for submission in uncertain:
            ours = [ref for ref, verdict in submission.candidates.items() if verdict == "ours"]
            assert ours == [submission.provider_ref]
    assert len(inferred) == n_products


@pytest.mark.parametrize("provider", ONE_PER_PROTOCOL, ids=str)
def test_a_worker_that_died_after_its_create_call_left_is_reconciled_as_the_provider_allows(
    processes, provider, settings, monkeypatch
):
    """The worst moment of rule 3, made on purpose: a worker stored that it was sending a unit, its
    create call reached the provider, and it died before recording the answer (here the test
    sends the unit itself and records nothing). The next worker never sends it blindly again: it
    adopts the unit by its key, or by the listing once the unit's results carry our custom_ids;
    where the provider cannot be searched the items wait for an operator. A synchronous server's
    `submit` makes no call, so there is nothing to reconcile: the unit is simply sent."""
    capabilities = provider.capabilities
    n_products = 8
    emulator_url = processes.emulator("--per-request-ms", "10", provider=provider)
    _, job = start_job(n_products, unit_size=4, provider=provider)
    operator = UserFactory(roles=["operator"])
    # The intents, as a worker plans them; then the first one's worker dies mid-send.
    first, _ = plan_submissions(job.pk)
    dead = Submission.objects.get(pk=first)
    requests = build_requests(dead)
    Submission.objects.filter(pk=dead.pk).update(
        sent_at=timezone.now(),
        requests_sent=len(requests),
        send_attempts=1,
        claimed_until=timezone.now() + timedelta(seconds=2),  # the dead worker's lease runs out
    )
    for name, value in provider.env(emulator_url).items():
        monkeypatch.setenv(name, value)
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        provider.name: {**settings.PROVIDERS[provider.name], "base_url": emulator_url},
    }
    orphan = get_provider(provider.name).submit(
        requests=requests, intent_key=dead.intent_key, metadata={"job": job.reference}
    )
    processes.start("qcluster")
    async_task("ledger.tasks.collect_round")

    resent = settle(
        job,
        processes,
        done=all_reviewable_and_closed(job, n_products),
        provider=provider,
        operator=operator,
        timeout=90,
        what="every item to await review and every unit to be closed",
    )
    assert_ledger_as_undisturbed(job, emulator_url, n_products, provider)
    dead.refresh_from_db()
    stats = emulator_stats(emulator_url)
    went_uncertain = Event.objects.filter(submission=dead, to_state=SubmissionState.UNCERTAIN).exists()
    if capabilities.delivery == Delivery.PER_REQUEST:
        # Nothing had been sent: no uncertainty, no operator, every request asked once.
        assert not went_uncertain and not resent
        assert dead.state == SubmissionState.COLLECTED
        assert stats["creates"] == n_products
    elif capabilities.finding == Finding.NOT_AT_ALL:
        # It waited for an operator, who sent it again: the unit that reached the provider ran
        # too, under the custom_ids the ledger gave up as never received, and was paid for.
        assert resent == [dead.pk] and dead.state == SubmissionState.FAILED
        assert units_at_provider(stats, provider) == 3
        given_up = set(dead.entries.values_list("custom_id", flat=True))
        assert given_up <= set(stats["inferences"])
        assert Item.objects.filter(job=job, inference_attempt=2).count() == len(requests)
    else:
        # Found again and adopted: the very unit the dead worker created, never a second one.
        assert not resent
        assert dead.state == SubmissionState.COLLECTED and dead.provider_ref == orphan
        assert units_at_provider(stats, provider) == 2
        assert went_uncertain == (capabilities.finding == Finding.BY_LISTING)
        assert not Item.objects.filter(job=job, inference_attempt__gt=1).exists()

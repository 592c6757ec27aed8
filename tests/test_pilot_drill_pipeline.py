"""The acceptance drill in real processes (issue 19, point 2): a pilot started through the API with
`drill: true`, run by a django-q2 worker cluster against the OpenAI Batch emulator (repeating some
result lines itself: its `duplicate_lines` switch) and PostgreSQL, reviewed and published into the
catalogue. Its own run has a collection killed mid-chunk and resumed by the next worker, a unit's
results delivered and collected twice, and a first destination attempt whose answer is lost and is
retried; its report lists each with the ledger entries it changed, and every check held."""

import pytest
from django.urls import reverse
from django_q.tasks import async_task

from ledger.actions.products import record_product
from ledger.actions.reviewing import approve_version
from ledger.models import DestinationAttempt, DrillKind, DrillStep, GeneratedVersion, Item, Job, Publication
from ledger.states import ItemState, SubmissionState
from tests.api.conftest import ApiClient, token_for
from tests.factories import UserFactory
from tests.processes import wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

SETTLED = {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED}


def test_a_drilled_pilot_runs_its_drill_in_the_workers_and_every_check_holds(processes, client):
    processes.emulator("--per-request-ms", "5", "--duplicate-rate", "0.5", "--seed", "5")
    owner = UserFactory(roles=["catalogue_owner"])
    for n in range(12):
        category = ("kitchen", "garden", "bath")[n % 3]
        record_product(
            sku=f"DRL-{n:03d}",
            title=f"Oak {category} board no. {n}",
            fields={"category": category, "material": "oak", "dimensions": f"{30 + n} x 20 cm"},
        )
    api = ApiClient(token_for(owner))
    processes.start("qcluster")

    body = {
        "reference": "drilled-pilot",
        "task": "product_description",
        "provider": "emulator",
        "unit_size": 4,
        "pilot": {"per_stratum": 3, "strata": ["category"], "seed": 2026, "drill": True},
    }
    started = api.post_json("/api/jobs", body)
    assert started.status_code == 202, started.content
    job = Job.objects.get(pk=started.json()["id"])
    async_task("ledger.tasks.collect_round")
    steps = DrillStep.objects.filter(pilot__job=job)

    def reviewable():
        states = set(Item.objects.filter(job=job).values_list("state", flat=True))
        delivered_again = steps.filter(kind=DrillKind.REPEATED_DELIVERY, done_at__isnull=False).exists()
        return (
            states <= SETTLED
            and delivered_again
            and not job.submissions.exclude(state=SubmissionState.COLLECTED).exists()
        )

    wait_until(reviewable, timeout=60, what="the drafts, the drilled unit resumed and delivered again")
    for item in Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW):
        version = item.versions.get()
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
    wait_until(
        lambda: not Item.objects.filter(job=job, state__in=[ItemState.APPROVED, ItemState.APPLYING]).exists(),
        timeout=30,
        what="approved drafts to be published, one of them retried",
    )
    for item in Item.objects.filter(job=job, state=ItemState.VALIDATION_FAILED):
        assert not item.versions.filter(valid=True).exists()

    response = api.get(f"/api/jobs/{job.pk}/pilot")
    assert response.status_code == 200, response.content
    drill = response.json()["drill"]
    assert drill["ran"] is True
    assert {check["name"]: check["held"] for check in drill["checks"]} == {
        "no_inference_paid_twice": True,
        "no_product_published_twice": True,
        "nothing_published_from_obsolete_or_withdrawn_source": True,
    }
    for check in drill["checks"]:
        assert check["evidence"]["summary"]
    step = {step["kind"]: step for step in drill["steps"]}

    # Killed mid-chunk in a worker: one line kept, the next chunk's draft and events rolled back; the
    # next worker recorded the rest, each request once.
    interrupted = step[DrillKind.INTERRUPTED_COLLECTION]
    assert interrupted["recorded"]["killed"] is True
    assert interrupted["recorded"]["before_the_kill"]["recorded"] == 1
    assert interrupted["recorded"]["lost_with_the_worker"]["versions_written"] == 1
    now = interrupted["ledger_now"]
    assert now["recorded"] == now["requests"] == 4 and now["requests_with_two_drafts"] == 0
    assert len(now["versions_after_the_kill"]) == 3 and now["collected_event"]

    # The same unit's results read again and offered to the recorder: nothing changed.
    repeated = step[DrillKind.REPEATED_DELIVERY]
    assert repeated["unit"]["id"] == interrupted["unit"]["id"]
    assert repeated["recorded"]["lines_offered"] == 4 and repeated["recorded"]["changed"] == []
    assert repeated["recorded"]["after"]["charge"]["settled_at"]

    # The first attempt's answer lost after the catalogue published; the retry, under the same key,
    # published nothing more.
    timed_out = step[DrillKind.DESTINATION_TIMEOUT]
    now = timed_out["ledger_now"]
    assert now["state"] == ItemState.APPLIED
    assert [attempt["outcome"] for attempt in now["attempts"]] == ["retryable", "applied"]
    assert len(now["operation_keys"]) == 1 and len(now["publications"]) == 1

    # The ledger says the same, over the whole job; the lines the emulator wrote twice are noted, once.
    repeated_lines = [
        anomaly
        for unit in job.submissions.all()
        for anomaly in unit.anomalies
        if anomaly["kind"] == "repeated_line"
    ]
    assert repeated_lines
    versions = GeneratedVersion.objects.filter(item__job=job)
    assert versions.count() == len(set(versions.values_list("custom_id", flat=True))) == 9
    applied = Item.objects.filter(job=job, state=ItemState.APPLIED)
    assert Publication.objects.filter(version__item__job=job).count() == applied.count() > 0
    assert DestinationAttempt.objects.filter(item__job=job).count() == applied.count() + 1

    client.force_login(owner)
    page = client.get(reverse("pilot_report", args=[job.pk])).content.decode()
    assert page.count("held.") >= 3 and "did not hold" not in page

"""Planning a job into units, and how the collector's tasks hold their claims: nothing is queued
twice, and nothing that is due is left waiting for a task that will not do it."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import OrmQ

from ledger import tasks
from ledger.actions.requests import build_requests
from ledger.actions.submitting import (
    claim_planning,
    intents_waiting,
    plan_submissions,
    send_submission,
)
from ledger.drafts.validation import render_user_message
from ledger.models import CollectorHeartbeat, Item, Job, SourceRevision, Submission, SubmissionItem
from ledger.states import ItemState, SubmissionState
from tests.factories import JobFactory, ProductFactory

pytestmark = pytest.mark.django_db


def job_with_items(n: int, unit_size: int = 4):
    job = JobFactory(unit_size=unit_size)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def queued() -> list[tuple[str, tuple]]:
    return [(row.task["func"], tuple(row.task["args"])) for row in OrmQ.objects.order_by("id")]


def started_by_a_pass() -> list[tuple[str, tuple]]:
    started = []
    tasks.poll_everything(start=lambda func, *args: started.append((func, args)))
    return started


def test_planning_for_its_task_claims_each_intent_for_the_send_queued_with_it(
    django_capture_on_commit_callbacks,
):
    job = job_with_items(10)
    OrmQ.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=True):
        intents = plan_submissions(job.pk, claim=True)

    assert len(intents) == 3
    claims = dict(Submission.objects.filter(pk__in=intents).values_list("pk", "claimed_by"))
    assert all(claims.values()) and len(set(claims.values())) == 3
    assert not Submission.objects.filter(pk__in=intents, claimed_until__lte=timezone.now()).exists()
    assert queued() == [("ledger.tasks.send_submission", (pk, claims[pk])) for pk in intents]
    # The pass leaves every intent to its task: no second send, and no planning either.
    assert [func for func, _ in started_by_a_pass()] == []


def test_an_intent_whose_send_task_was_lost_is_sent_by_a_pass_once_its_claim_runs_out(
    django_capture_on_commit_callbacks,
):
    job = job_with_items(4)
    with django_capture_on_commit_callbacks(execute=True):
        [intent] = plan_submissions(job.pk, claim=True)
    planners = Submission.objects.get(pk=intent).claimed_by
    Submission.objects.filter(pk=intent).update(claimed_until=timezone.now())

    [(func, (submission_id, claim))] = started_by_a_pass()
    assert (func, submission_id) == ("ledger.tasks.send_submission", intent)
    assert claim != planners and Submission.objects.get(pk=intent).claimed_by == claim


def test_planning_without_a_claim_leaves_the_intents_to_the_next_pass():
    job = job_with_items(4)
    [intent] = plan_submissions(job.pk)

    assert Submission.objects.get(pk=intent).claimed_until is None
    [(func, (submission_id, claim))] = started_by_a_pass()
    assert (func, submission_id) == ("ledger.tasks.send_submission", intent)
    assert Submission.objects.get(pk=intent).claimed_by == claim


def test_planning_puts_every_waiting_item_in_a_unit_in_id_order_and_leaves_those_not_due():
    job = job_with_items(11)
    ids = list(Item.objects.filter(job=job).order_by("id").values_list("pk", flat=True))
    # One waits for a retry's backoff.
    Item.objects.filter(pk=ids[2]).update(next_attempt_at=timezone.now() + timedelta(hours=1))

    intents = plan_submissions(job.pk)

    units = [
        list(SubmissionItem.objects.filter(submission_id=pk).order_by("id").values_list("item_id", flat=True))
        for pk in intents
    ]
    assert units == [[ids[0], ids[1], ids[3], ids[4]], [ids[5], ids[6], ids[7], ids[8]], [ids[9], ids[10]]]
    # Its backoff over, it is planned by the next planning, alone.
    Item.objects.filter(pk=ids[2]).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    [later] = plan_submissions(job.pk)
    assert list(SubmissionItem.objects.filter(submission_id=later).values_list("item_id", flat=True)) == [
        ids[2]
    ]
    assert not Item.objects.filter(job=job, submission__isnull=True).exists()


@pytest.mark.postgresql_only
def test_the_look_for_unplanned_items_reads_no_planned_one():
    """Planned items stay `prepared` until sent: the pass's look for a job with items to plan, and
    planning itself, go straight to the unplanned ones by their own index."""
    job = job_with_items(30)
    plan_submissions(job.pk)
    unplanned = Item.objects.filter(job=job, state=ItemState.PREPARED, submission__isnull=True).order_by("id")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        sql, params = unplanned.values("pk")[:4].query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "item_unplanned" in plan


def test_a_round_waiting_for_its_next_pass_ends_as_soon_as_a_newer_round_takes_the_lease():
    CollectorHeartbeat.objects.create(name="collector", lease_holder="newer round")
    held = CollectorHeartbeat.objects.filter(name="collector")

    # An hour's wait, were the lease still this round's.
    assert tasks.wait_holding(held, "older round", 3600) is False
    assert tasks.wait_holding(held, "newer round", 0.5) is True


def test_a_poll_holds_the_passs_claim_until_the_providers_answer_is_recorded(
    clock, emulator, provider, monkeypatch
):
    """A pass coming round while the provider is being asked queues no second poll; the ended
    unit is collected by the poll that saw it end, not left to a task queued behind it."""
    job = job_with_items(4)
    [submission_id] = plan_submissions(job.pk)
    assert send_submission(submission_id, provider=provider) == "sent"
    [(_, (_, claim))] = started_by_a_pass()
    during = []
    real_status = type(provider).status

    def status_while_a_pass_comes_round(self, provider_ref):
        answer = real_status(self, provider_ref)
        during.extend(started_by_a_pass())
        return answer

    monkeypatch.setattr(type(provider), "status", status_while_a_pass_comes_round)
    monkeypatch.setattr("ledger.tasks.get_provider", lambda name: provider)
    for _ in range(200):
        said = tasks.poll_submission(submission_id, claim)
        if said == "collected":
            break
        [(_, (_, claim))] = started_by_a_pass()  # not ended yet: released, and queued again
        clock.advance(ms=10)
    assert said == "collected" and during == []
    assert Submission.objects.get(pk=submission_id).state == SubmissionState.COLLECTED
    assert set(Item.objects.filter(job=job).values_list("state", flat=True)) == {ItemState.AWAITING_REVIEW}


def test_a_send_task_takes_over_the_claim_it_was_queued_with_and_no_other(emulator, provider):
    job = job_with_items(4)
    [intent] = plan_submissions(job.pk)
    [(_, (_, claim))] = started_by_a_pass()

    assert send_submission(intent, provider=provider, held="another claim") == "not claimable"
    assert send_submission(intent, provider=provider, held=claim) == "sent"
    assert emulator.stats()["batches"] == 1


def test_a_units_entries_carry_each_items_own_custom_id_in_the_items_order():
    job = job_with_items(6, unit_size=10)
    Item.objects.filter(job=job, pk__in=Item.objects.filter(job=job).order_by("id")[:2]).update(
        inference_attempt=3
    )

    [intent] = plan_submissions(job.pk)

    entries = list(SubmissionItem.objects.filter(submission_id=intent).order_by("id"))
    items = list(Item.objects.filter(job=job).order_by("id"))
    assert [(entry.item_id, entry.custom_id, entry.outcome) for entry in entries] == [
        (item.pk, item.custom_id, "") for item in items
    ]
    assert {item.submission_id for item in items} == {intent}
    assert items[0].custom_id == f"bd-{items[0].pk}-3"


def test_a_units_requests_carry_each_items_prompt_as_its_revision_renders_it():
    job = job_with_items(3, unit_size=10)
    revision = Item.objects.filter(job=job).order_by("id").first().source_revision
    SourceRevision.objects.filter(pk=revision.pk).update(
        fields={"b": [1, {"z": None, "a": "é"}], "a": 2.5, "c": "plain"}
    )
    [intent] = plan_submissions(job.pk)

    requests = build_requests(Submission.objects.get(pk=intent))

    items = Item.objects.filter(job=job).order_by("id").select_related("source_revision")
    assert [(r.custom_id, r.user_message) for r in requests] == [
        (item.custom_id, render_user_message(job.prompt_version, item.source_revision)) for item in items
    ]
    assert "- b: [1,{" in requests[0].user_message


def test_planning_ahead_stops_at_that_many_waiting_units_and_goes_on_as_they_leave():
    job = job_with_items(20, unit_size=2)

    first = plan_submissions(job.pk, claim=True, ahead=3)

    assert len(first) == 3 and intents_waiting(job.pk) == 3
    assert Item.objects.filter(job=job, submission__isnull=True).count() == 14
    # Nothing left its intents: planning again plans nothing.
    assert plan_submissions(job.pk, claim=True, ahead=3) == []
    Submission.objects.filter(pk=first[0]).update(state=SubmissionState.OPEN)
    [more] = plan_submissions(job.pk, claim=True, ahead=3)
    assert more > first[-1]
    # Without `ahead` (an operator's command, the tests) every item is planned at once.
    assert len(plan_submissions(job.pk)) == 6
    assert not Item.objects.filter(job=job, submission__isnull=True).exists()


def test_a_pass_queues_one_planning_task_a_job_until_its_planner_lets_go(settings):
    settings.BATCHDESK_WORKERS = 1  # two units planned ahead
    job = job_with_items(12, unit_size=2)

    assert started_by_a_pass() == [("ledger.tasks.submit_job", (job.pk,))]
    # Queued, not yet run: the job's planning is claimed, so the next passes queue no second one.
    assert started_by_a_pass() == [] and started_by_a_pass() == []

    intents = tasks.submit_job(job.pk)

    assert len(intents) == 2
    assert Job.objects.get(pk=job.pk).planning_claimed_until is None
    # Two units wait to be sent: nothing more to plan until one is sent.
    assert [func for func, _ in started_by_a_pass()] == []
    Submission.objects.filter(pk=intents[0]).update(state=SubmissionState.OPEN)
    assert started_by_a_pass() == [("ledger.tasks.submit_job", (job.pk,))]


def test_a_planning_claim_left_by_a_dead_planner_runs_out():
    job = job_with_items(4)
    assert claim_planning(job.pk) and not claim_planning(job.pk)
    assert started_by_a_pass() == []

    Job.objects.filter(pk=job.pk).update(planning_claimed_until=timezone.now() - timedelta(seconds=1))

    assert started_by_a_pass() == [("ledger.tasks.submit_job", (job.pk,))]


def test_a_sent_unit_makes_room_for_the_next_which_its_send_task_plans(
    emulator, provider, monkeypatch, settings
):
    settings.BATCHDESK_WORKERS = 1
    monkeypatch.setattr("ledger.actions.submitting.get_provider", lambda name: provider)
    job = job_with_items(10, unit_size=2)
    first, second = tasks.submit_job(job.pk)
    claims = dict(Submission.objects.filter(pk__in=[first, second]).values_list("pk", "claimed_by"))

    assert tasks.send_submission(first, claims[first]) == "sent"

    [third] = Submission.objects.filter(job=job, state=SubmissionState.INTENT).exclude(pk=second)
    assert third.pk > second and third.claimed_by and third.claimed_until > timezone.now()
    assert intents_waiting(job.pk) == 2
    assert Job.objects.get(pk=job.pk).planning_claimed_until is None
    # The send queued with it is that unit's own: the pass leaves both waiting intents to theirs.
    started = started_by_a_pass()
    assert started == [("ledger.tasks.poll_submission", (first, Submission.objects.get(pk=first).claimed_by))]

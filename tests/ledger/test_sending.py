"""A job's planner sends each unit as soon as its intent is committed, by threads of its own, while it
plans the next (`submitting.Senders`): no send waits in the queue behind polls and collections. One
planner at a time sends a job's units; the rules of sending hold as they do for a send task (an intent
stored before any call, each unit sent once). Threads commit on their own: these tests commit too."""

import threading
from concurrent import futures
from contextlib import contextmanager

import httpx
import psycopg
import pytest
from django.db import connection
from django_q.models import OrmQ

from ledger import tasks
from ledger.actions import submitting
from ledger.models import Item, Job, Submission
from ledger.providers.openai import OpenAIBatchProvider
from ledger.states import ItemState, SubmissionState
from tests.factories import JobFactory, ProductFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only]


@pytest.fixture
def sending_to(emulator, monkeypatch):
    """Each send talks to the emulator with a client of its own, as `get_provider` gives each."""

    def provider(name):
        return OpenAIBatchProvider(
            client=httpx.Client(base_url=emulator.base_url, headers={"Authorization": "Bearer k"}, timeout=10)
        )

    monkeypatch.setattr("ledger.actions.submitting.get_provider", provider)
    return emulator


def job_with_items(n: int, unit_size: int):
    job = JobFactory(unit_size=unit_size)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def queued_sends() -> list:
    return [
        row.task["args"] for row in OrmQ.objects.all() if row.task["func"] == "ledger.tasks.send_submission"
    ]


def test_the_planner_sends_each_unit_it_plans_once_and_queues_no_send(sending_to):
    job = job_with_items(11, unit_size=2)
    OrmQ.objects.all().delete()

    planned = tasks.submit_job(job.pk)

    units = Submission.objects.filter(job=job)
    assert sorted(planned) == sorted(units.values_list("pk", flat=True)) and len(planned) == 6
    assert set(units.values_list("state", flat=True)) == {SubmissionState.OPEN}
    assert sending_to.stats()["batches_by_intent"] == {unit.intent_key: 1 for unit in units}
    assert set(Item.objects.filter(job=job).values_list("state", flat=True)) == {ItemState.SUBMITTED}
    assert queued_sends() == []
    assert Job.objects.get(pk=job.pk).planning_claimed_until is None
    # Each unit was claimed by its planner, and let go once sent.
    assert not units.filter(claimed_until__isnull=False).exists()


@contextmanager
def sending_held_elsewhere(job):
    """Another worker's planner holding the job's sending (its own session)."""
    settings = connection.settings_dict
    with psycopg.connect(
        dbname=settings["NAME"],
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
    ) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [submitting.SENDING_LOCK, job.pk])
        yield other


def test_a_second_planner_leaves_the_job_to_the_one_sending_it(sending_to, monkeypatch):
    monkeypatch.setattr("ledger.actions.submitting.SENDING_PATIENCE", 0.5)
    job = job_with_items(4, unit_size=2)
    submitting.claim_planning(job.pk)

    with sending_held_elsewhere(job):
        assert tasks.submit_job(job.pk) == []

        assert not Submission.objects.filter(job=job).exists()
        # Its planning let go, for the next pass to plan what that planner leaves.
        assert Job.objects.get(pk=job.pk).planning_claimed_until is None

    # Once that one is done, the job is planned and sent.
    assert len(tasks.submit_job(job.pk)) == 2
    assert set(Submission.objects.filter(job=job).values_list("state", flat=True)) == {SubmissionState.OPEN}


def test_a_planner_sending_its_last_units_is_waited_for(sending_to):
    job = job_with_items(4, unit_size=2)

    with sending_held_elsewhere(job) as other:
        threading.Timer(0.5, other.execute, ["SELECT pg_advisory_unlock_all()"]).start()
        assert len(tasks.submit_job(job.pk)) == 2

    assert set(Submission.objects.filter(job=job).values_list("state", flat=True)) == {SubmissionState.OPEN}


def test_a_stopping_cluster_plans_no_more_and_leaves_the_job_to_the_next_planner(sending_to, monkeypatch):
    job = job_with_items(4, unit_size=2)
    monkeypatch.setattr("ledger.tasks.stop_asked", lambda: True)

    assert tasks.submit_job(job.pk) == []

    assert not Submission.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).planning_claimed_until is None
    monkeypatch.setattr("ledger.tasks.stop_asked", lambda: False)
    assert len(tasks.submit_job(job.pk)) == 2


def test_a_unit_whose_send_fails_keeps_its_claim_for_a_pass_and_the_others_are_sent(sending_to, monkeypatch):
    job = job_with_items(6, unit_size=2)
    real = submitting.send_submission
    failing = []

    def send_or_fail(submission_id, **kwargs):
        if not failing:
            failing.append(submission_id)
            raise RuntimeError("the database went away")
        return real(submission_id, **kwargs)

    monkeypatch.setattr("ledger.actions.submitting.send_submission", send_or_fail)

    assert len(tasks.submit_job(job.pk)) == 3

    [failed] = failing
    assert Submission.objects.get(pk=failed).state == SubmissionState.INTENT
    assert Submission.objects.get(pk=failed).claimed_until is not None  # a pass sends it once that runs out
    assert Submission.objects.filter(job=job, state=SubmissionState.OPEN).count() == 2


def test_a_unit_goes_to_a_sender_thread_that_has_finished_rather_than_the_planner(sending_to, monkeypatch):
    """The planner sends a unit itself only while both its threads are busy: a thread that finished
    while the planner sent its own unit takes the next one (the planner sending that too left both
    threads idle for a whole send)."""
    job = job_with_items(10, unit_size=2)
    real_send, real_hand_over = submitting.send_submission, submitting.Senders.send
    planner_sent = threading.Event()
    sent_by = {}

    def send(submission_id, **kwargs):
        if threading.current_thread() is threading.main_thread():
            planner_sent.set()
        else:
            planner_sent.wait(timeout=10)  # the threads stay busy until the planner has sent one
        sent_by[submission_id] = threading.current_thread().name
        return real_send(submission_id, **kwargs)

    def hand_over_once_the_threads_are_done(senders, submission_id, claim):
        if planner_sent.is_set():
            futures.wait(list(senders.in_flight))  # they finished while the next unit was planned
        return real_hand_over(senders, submission_id, claim)

    monkeypatch.setattr("ledger.actions.submitting.send_submission", send)
    monkeypatch.setattr(submitting.Senders, "send", hand_over_once_the_threads_are_done)

    assert len(tasks.submit_job(job.pk)) == 5

    by_planner = [unit for unit, name in sent_by.items() if name == threading.main_thread().name]
    assert len(sent_by) == 5 and len(by_planner) == 1
    assert set(Submission.objects.filter(job=job).values_list("state", flat=True)) == {SubmissionState.OPEN}

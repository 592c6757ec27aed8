"""The collector's round only decides what is due: each unit of work is a task of its own, claimed
when it is queued, run by whichever worker takes it, and queued again only once its claim runs out
(real `qcluster` processes, a real emulator, PostgreSQL)."""

import pytest
from django_q.models import OrmQ, Success
from django_q.tasks import async_task

from ledger import tasks
from ledger.actions.submitting import plan_submissions
from ledger.models import Event, Item, Submission
from ledger.states import ItemState, SubmissionState
from tests.processes import emulator_stats, wait_until
from tests.provider_emulators import BY_NAME
from tests.test_worker_faults import assert_ledger_as_undisturbed, start_job

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def queued() -> list[tuple[str, tuple]]:
    """The tasks waiting in the queue (the database's: these tests run without Redis)."""
    return [(row.task["func"], row.task["args"]) for row in OrmQ.objects.order_by("id")]


def all_awaiting_review(job, n: int) -> None:
    wait_until(
        lambda: Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == n,
        timeout=120,
        what="every item to await review",
    )


def test_a_pass_queues_one_claimed_task_per_unit_of_work_and_does_none_of_it(processes):
    emulator_url = processes.emulator("--per-request-ms", "5")
    _, job = start_job(12, unit_size=4)
    intents = plan_submissions(job.pk)
    OrmQ.objects.all().delete()  # what create_job and planning queued: only the pass's own tasks count

    assert tasks.poll_everything() == 3
    sends = queued()
    assert sorted(args for _, args in sends) == sorted((pk, sends[0][1][1]) for pk in intents)
    assert {func for func, _ in sends} == {"ledger.tasks.send_submission"}
    # Claimed as they were queued: the next pass queues nothing more for them.
    assert tasks.poll_everything() == 0
    assert len(queued()) == 3
    # And nothing was done: the provider was asked nothing, every intent still waits.
    assert emulator_stats(emulator_url)["creates"] == 0
    assert set(Submission.objects.filter(job=job).values_list("state", flat=True)) == {SubmissionState.INTENT}

    processes.start("qcluster")
    async_task("ledger.tasks.collect_round")
    all_awaiting_review(job, 12)
    assert_ledger_as_undisturbed(job, emulator_url, 12, BY_NAME["emulator"])
    # Each intent was sent by the task the pass queued for it; the round's polls were tasks too.
    sent = Success.objects.filter(func="ledger.tasks.send_submission")
    assert sorted(task.args[0] for task in sent if task.result == "sent") == sorted(intents)
    polled = {task.args[0] for task in Success.objects.filter(func="ledger.tasks.poll_submission")}
    assert polled == set(intents)


def test_a_task_the_queue_lost_is_queued_again_once_its_claim_runs_out(processes, settings):
    """Redis keeps no copy of a task a cluster has taken: killed, that cluster takes the task with
    it. The claim the pass took when queuing it runs out, and the next pass queues it again."""
    settings.BATCHDESK_LEASE_SECONDS = float(processes.env["BATCHDESK_LEASE_SECONDS"])
    emulator_url = processes.emulator("--per-request-ms", "5")
    _, job = start_job(8, unit_size=4)
    intents = plan_submissions(job.pk)
    assert tasks.poll_everything() == 2
    claimed_until = dict(Submission.objects.filter(job=job).values_list("pk", "claimed_until"))
    OrmQ.objects.all().delete()  # the queue lost every task

    processes.start("qcluster")
    async_task("ledger.tasks.collect_round")
    all_awaiting_review(job, 8)
    assert_ledger_as_undisturbed(job, emulator_url, 8, BY_NAME["emulator"])
    for submission_id in intents:
        # Nobody sent it while the lost task's claim held it; once it ran out, it was sent once.
        [sent] = Event.objects.filter(submission_id=submission_id, to_state=SubmissionState.OPEN)
        assert sent.at > claimed_until[submission_id]

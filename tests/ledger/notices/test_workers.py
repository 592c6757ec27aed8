"""Job notifications sent by a real worker cluster, as deployed: the job's events reach a receiver that
answers 500 to its first call, each event once delivered, the first after a retry the collector's pass
picked up; and a receiver that never answers holds up neither the job nor the collector."""

import json
import socket
import time

import pytest
from django_q.tasks import async_task

from ledger.actions.jobs import create_job
from ledger.models import CollectorHeartbeat, JobNotification
from ledger.states import JobState
from tests.factories import UserFactory
from tests.ledger.notices.receiver import SECRET, EventReceiver
from tests.processes import make_catalogue, wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def test_a_worker_cluster_tells_the_receiver_of_each_event_once_retrying_a_500(processes):
    processes.emulator("--per-request-ms", "5", "--seed", "5")
    owner = UserFactory(roles=["catalogue_owner"])
    make_catalogue(6)
    with EventReceiver(500) as receiver:
        processes.start(
            "qcluster",
            BATCHDESK_NOTIFY_SECRET=SECRET,
            BATCHDESK_NOTIFY_RETRY_SECONDS="1",
            BATCHDESK_NOTIFY_ALLOWED_HOSTS="127.0.0.1",  # the receiver lives on this machine
        )
        job = create_job(
            reference="told",
            owner=owner,
            task="product_description",
            provider="emulator",
            notify_url=receiver.url,
            unit_size=3,
        )
        async_task("ledger.tasks.collect_round")  # rather than wait for the schedule's first round

        def all_delivered():
            job.refresh_from_db()
            notifications = JobNotification.objects.filter(job=job)
            return (
                job.state == JobState.IN_REVIEW
                and notifications.filter(event_type="job.in_review").exists()
                and not notifications.filter(delivered_at__isnull=True).exists()
            )

        wait_until(all_delivered, timeout=180, what="the job in review and every event delivered")

    first = JobNotification.objects.filter(job=job).order_by("pk").first()
    assert first.event_type == "job.preparing"
    assert [(a.status, a.delivered) for a in first.tries.order_by("pk")] == [(500, False), (200, True)]
    for notification in JobNotification.objects.filter(job=job).exclude(pk=first.pk):
        assert notification.attempts == 1
    assert all(call.signed for call in receiver.calls)
    told = [json.loads(call.body)["type"] for call in receiver.calls if call.status == 200]
    # A retried event may arrive after later ones: each carries its `timestamp` for a receiver to order by.
    assert {"job.preparing", "job.running", "job.in_review"} <= set(told)
    assert len(told) == len(set(told)) == JobNotification.objects.filter(job=job).count()


def test_a_receiver_that_never_answers_holds_up_nothing(processes):
    """A receiver that takes the connection and never answers: the job reaches review and the collector
    goes on polling meanwhile; the notification waits for its next attempt."""
    processes.emulator("--per-request-ms", "5", "--seed", "6")
    owner = UserFactory(roles=["catalogue_owner"])
    make_catalogue(4)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        processes.start(
            "qcluster",
            BATCHDESK_NOTIFY_SECRET=SECRET,
            BATCHDESK_NOTIFY_TIMEOUT="30",
            BATCHDESK_NOTIFY_ALLOWED_HOSTS="127.0.0.1",
        )
        job = create_job(
            reference="unheard",
            owner=owner,
            task="product_description",
            provider="emulator",
            notify_url=f"http://127.0.0.1:{port}/events",
        )
        async_task("ledger.tasks.collect_round")
        started = time.time()

        def in_review():
            job.refresh_from_db()
            return job.state == JobState.IN_REVIEW

        wait_until(in_review, timeout=180, what="the job to reach review")
        assert not JobNotification.objects.filter(job=job, delivered_at__isnull=False).exists()
        # The collector polled meanwhile, however long the receiver kept its callers waiting.
        assert CollectorHeartbeat.objects.get(name="collector").last_poll_at.timestamp() > started

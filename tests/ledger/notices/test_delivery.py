"""Job events to a notify_url and owners' e-mail (SPEC §6, `ledger.notices.notifications`): written with the
change they tell of, sent after it by a worker's task, signed, tried again until delivered or given
up, every attempt recorded. The receiver is a real HTTP server checking signatures itself, on this
machine: BATCHDESK_NOTIFY_ALLOWED_HOSTS names it, as a deployment with a local receiver would."""

import json
import socket
import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.db import transaction
from django.utils import timezone

from ledger import tasks
from ledger.actions.budgeting import pause
from ledger.actions.job_states import refresh_job_state
from ledger.actions.operating import cancel_job
from ledger.models import JobNotification, NotificationAttempt, NotificationChannel, PauseReason
from ledger.notices.notifications import BUDGET_REACHED
from ledger.states import ItemState, JobState
from tests import collector
from tests.factories import ItemFactory, JobFactory, UserFactory
from tests.ledger.notices.receiver import SECRET, EventReceiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def notify_secret(settings):
    settings.BATCHDESK_NOTIFY_SECRET = SECRET
    settings.BATCHDESK_NOTIFY_RETRY_SECONDS = 0  # a retry is due at once, for the next pass
    settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = ["127.0.0.1"]


def send_now(notification: JobNotification) -> str:
    """What the worker does with the task written on commit."""
    notification.refresh_from_db()
    return tasks.send_notification(notification.pk, notification.next_attempt_at)


def test_a_receiver_that_answers_500_then_200_gets_one_notification_sent_twice_and_signed(
    django_capture_on_commit_callbacks,
):
    with EventReceiver(500, 200) as receiver:
        job = JobFactory(notify_url=receiver.url)
        with django_capture_on_commit_callbacks() as queued:
            cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        assert receiver.calls == []  # nothing is sent inside the change's transaction
        assert len(queued) == 1  # its task is queued once the change has committed

        assert send_now(notification) == "not delivered"
        # The retry is the collector's pass's to find and send.
        assert collector.poll_everything() >= 1

    notification.refresh_from_db()
    assert notification.delivered_at is not None and notification.next_attempt_at is None
    assert notification.attempts == 2
    assert [(a.status, a.delivered) for a in notification.tries.all()] == [(500, False), (200, True)]
    assert [call.status for call in receiver.calls] == [500, 200]
    assert all(call.signed for call in receiver.calls)  # by the standardwebhooks library itself
    # The same webhook-id on each attempt, so the receiver can tell a repeat.
    assert {call.headers["webhook-id"] for call in receiver.calls} == {notification.message_id}
    event = json.loads(receiver.calls[-1].body)
    assert event["type"] == "job.cancelled"
    assert event["job"] == {"id": job.pk, "reference": job.reference, "state": "cancelled", "counts": {}}


def test_events_are_written_with_the_change_and_vanish_with_it():
    job = JobFactory(notify_url="http://127.0.0.1:9/events")
    item = ItemFactory(job=job, state=ItemState.AWAITING_REVIEW)
    JobNotification.objects.all().delete()  # the factory's own state changes

    with pytest.raises(RuntimeError), transaction.atomic():
        refresh_job_state(job.pk)
        assert JobNotification.objects.filter(event_type="job.in_review").exists()
        raise RuntimeError("the change fails after its event was written")
    assert not JobNotification.objects.exists()

    assert refresh_job_state(job.pk) == JobState.IN_REVIEW
    event = json.loads(bytes(JobNotification.objects.get().body))
    assert event["type"] == "job.in_review"
    assert event["job"]["counts"] == {ItemState.AWAITING_REVIEW: 1}
    assert item.job_id == event["job"]["id"]


def test_a_job_paused_by_its_budget_tells_of_the_pause_and_of_the_budget():
    job = JobFactory(notify_url="http://127.0.0.1:9/events", state=JobState.RUNNING)
    with transaction.atomic():
        pause(job, PauseReason.BUDGET_REACHED, "The next unit could cost up to 3.00 GBP")
    assert sorted(JobNotification.objects.values_list("event_type", flat=True)) == [
        BUDGET_REACHED,
        "job.paused",
    ]


def test_a_job_without_notify_url_or_owner_address_writes_nothing():
    job = JobFactory(owner=UserFactory(email=""))
    ItemFactory(job=job, state=ItemState.AWAITING_REVIEW)
    refresh_job_state(job.pk)
    cancel_job(job_id=job.pk)
    assert not JobNotification.objects.exists()


def test_a_receiver_never_answering_is_given_up_24_hours_after_the_event():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    job = JobFactory(notify_url=f"http://127.0.0.1:{port}/events")
    cancel_job(job_id=job.pk)
    notification = JobNotification.objects.get()

    assert send_now(notification) == "not delivered"
    notification.refresh_from_db()
    assert notification.gave_up_at is None and notification.next_attempt_at is not None
    assert "Could not be reached" in notification.tries.get().error

    JobNotification.objects.filter(pk=notification.pk).update(
        created_at=timezone.now() - timedelta(hours=24, seconds=1)
    )
    assert send_now(notification) == "not delivered"
    notification.refresh_from_db()
    assert notification.gave_up_at is not None and notification.next_attempt_at is None
    assert notification.attempts == 2
    assert collector.poll_everything() == 0  # nothing left to send


def test_a_lost_task_is_sent_by_the_collectors_pass_and_a_repeated_task_sends_nothing():
    with EventReceiver() as receiver:
        job = JobFactory(notify_url=receiver.url)
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        queued_for = notification.next_attempt_at
        # Its task was lost (the broker was down): once its time to be taken has passed, the pass sends it.
        JobNotification.objects.filter(pk=notification.pk).update(next_attempt_at=timezone.now())
        assert collector.poll_everything() == 1
        # The lost task turning up after all changes nothing.
        assert tasks.send_notification(notification.pk, queued_for) == "not due"
    assert len(receiver.calls) == 1
    assert NotificationAttempt.objects.count() == 1


def test_a_redirect_is_an_answer_not_followed():
    with EventReceiver(200) as elsewhere, EventReceiver((307, {"Location": elsewhere.url}, b"")) as receiver:
        job = JobFactory(notify_url=receiver.url)
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        assert send_now(notification) == "not delivered"
    assert elsewhere.calls == []
    assert notification.tries.get().status == 307


def test_an_address_that_became_unsafe_is_not_called(settings):
    """A job's address is checked again at each call: here it names the cloud metadata service."""
    settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = []
    job = JobFactory(notify_url="http://169.254.169.254/latest/meta-data/")
    cancel_job(job_id=job.pk)
    notification = JobNotification.objects.get()
    assert send_now(notification) == "not delivered"
    assert "a cloud metadata address" in notification.tries.get().error


def test_a_name_resolving_to_loopback_is_refused_after_resolution_and_never_connected(settings):
    """Issue 28, point 3: with BATCHDESK_NOTIFY_ALLOWED_HOSTS unset, a name that resolves to this
    machine is refused at the call (a job started while the setting named it, or a name re-pointed
    since its start): the attempt says why and the receiver, listening there, is never called."""
    with EventReceiver() as receiver:
        port = receiver.url.split(":")[2].split("/")[0]
        job = JobFactory(notify_url=f"http://localhost:{port}/batchdesk-events")
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = []
        assert send_now(notification) == "not delivered"
        assert receiver.calls == []
        attempt = notification.tries.get()
        assert (attempt.status, attempt.delivered) == (None, False)
        assert "The host localhost is 127.0.0.1, a loopback address" in attempt.error
        assert "unless BATCHDESK_NOTIFY_ALLOWED_HOSTS names the host" in attempt.error
        # Named, the same receiver is called: it was listening all along.
        settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = ["localhost"]
        assert send_now(notification) == "delivered"
    assert [call.headers["host"] for call in receiver.calls] == [f"localhost:{port}"]


def test_a_host_that_is_not_ascii_is_called_idna_encoded_or_refused_with_an_attempt(settings):
    """Found by attacking issue 28: `ⓛⓞⓒⓐⓛⓗⓞⓢⓣ` crashed every send before an attempt was recorded,
    and the notice waited for ever (126 tracebacks in 25 minutes)."""
    with EventReceiver() as receiver:
        port = receiver.url.split(":")[2].split("/")[0]
        job = JobFactory(notify_url=f"http://\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3:{port}/e")
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = []
        assert send_now(notification) == "not delivered"
        assert "The host localhost is 127.0.0.1, a loopback address" in notification.tries.get().error
        settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = ["localhost"]
        assert send_now(notification) == "delivered"
    [call] = receiver.calls
    assert call.headers["host"] == f"localhost:{port}" and call.signed


def test_an_error_while_sending_is_an_attempt_with_its_reason_and_given_up_after_24_hours():
    """Whatever goes wrong while sending is recorded as an attempt, through the worker's own task:
    here httpx refuses a DEL in the address (a job started before the start's check refused it)."""
    with EventReceiver() as receiver:
        job = JobFactory(notify_url=receiver.url + "\x7f")
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        assert send_now(notification) == "not delivered"
        notification.refresh_from_db()
        attempt = notification.tries.get()
        assert attempt.error.startswith(
            "Could not be sent (InvalidURL): Invalid non-printable ASCII character"
        )
        assert notification.gave_up_at is None and notification.next_attempt_at is not None

        JobNotification.objects.filter(pk=notification.pk).update(
            created_at=timezone.now() - timedelta(hours=24, seconds=1)
        )
        assert send_now(notification) == "not delivered"
        notification.refresh_from_db()
        assert notification.gave_up_at is not None and notification.next_attempt_at is None
        assert notification.attempts == 2
        assert collector.poll_everything() == 0
    assert receiver.calls == []


def test_a_notice_no_attempt_could_be_recorded_for_is_given_up_all_the_same():
    """The 24 hours hold whatever happens: a notice an hour past its last attempt's time that no
    worker could record (killed each time, or its record refused) is given up by the collector's pass,
    not sent on for ever."""
    with EventReceiver() as receiver:
        job = JobFactory(notify_url=receiver.url)
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        JobNotification.objects.filter(pk=notification.pk).update(
            created_at=timezone.now() - timedelta(hours=25, seconds=1), next_attempt_at=timezone.now()
        )
        assert collector.poll_everything() == 0
    notification.refresh_from_db()
    assert notification.gave_up_at is not None and notification.next_attempt_at is None
    assert receiver.calls == []


def test_a_name_rebound_to_the_metadata_service_after_the_check_is_not_called(monkeypatch, settings):
    settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = ["receiver.internal.example"]
    job = JobFactory(notify_url="http://receiver.internal.example/events")
    cancel_job(job_id=job.pk)
    notification = JobNotification.objects.get()
    # The name resolved to a private address when the job started (it is named in the allowed hosts);
    # now it resolves to the metadata service, which no naming allows.
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, port, *args, **kwargs: [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))
        ],
    )
    assert send_now(notification) == "not delivered"
    assert "169.254.169.254, a cloud metadata address" in notification.tries.get().error


def test_the_answer_kept_is_a_short_scrubbed_excerpt(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-notify-test-0123456789abcdef")
    answer = b"Bad gateway sk-live-notify-test-0123456789abcdef " + b"x" * 5000
    with EventReceiver((502, {}, answer)) as receiver:
        job = JobFactory(notify_url=receiver.url)
        cancel_job(job_id=job.pk)
        send_now(JobNotification.objects.get())
    kept = NotificationAttempt.objects.get().answer
    assert kept.startswith("Bad gateway [redacted] xxx")
    assert len(kept) <= 200


def test_no_secret_no_call(settings):
    """Without a secret a job may not name a notify_url; one named before is never sent unsigned."""
    with EventReceiver() as receiver:
        job = JobFactory(notify_url=receiver.url)
        cancel_job(job_id=job.pk)
        settings.BATCHDESK_NOTIFY_SECRET = ""
        assert send_now(JobNotification.objects.get()) == "not delivered"
    assert receiver.calls == []
    assert "never sent unsigned" in NotificationAttempt.objects.get().error


# --- e-mail --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item_state", "job_state"),
    [
        (ItemState.AWAITING_REVIEW, JobState.IN_REVIEW),
        (ItemState.DEAD_LETTER, JobState.NEEDS_ATTENTION),
        (ItemState.APPLIED, JobState.COMPLETED),
    ],
)
def test_the_owner_is_emailed_once_when_the_job_reaches_a_state_for_people(item_state, job_state):
    owner = UserFactory(email="owner@example.com")
    job = JobFactory(owner=owner)
    ItemFactory(job=job, state=item_state)
    JobNotification.objects.all().delete()

    assert refresh_job_state(job.pk) == job_state
    notification = JobNotification.objects.get()
    assert (notification.channel, notification.recipient) == (NotificationChannel.EMAIL, "owner@example.com")
    queued_for = notification.next_attempt_at

    assert send_now(notification) == "delivered"
    assert tasks.send_notification(notification.pk, queued_for) == "not due"  # a repeated task
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["owner@example.com"]
    assert job.reference in message.subject and job.reference in message.body


def test_running_and_cancelled_are_not_emailed():
    owner = UserFactory(email="owner@example.com")
    job = JobFactory(owner=owner)
    cancel_job(job_id=job.pk)
    assert not JobNotification.objects.filter(channel=NotificationChannel.EMAIL).exists()


# --- on the job page -----------------------------------------------------------------------


def test_the_job_page_shows_each_notification_and_attempt_and_the_answer_escaped_to_its_owner(client):
    owner = UserFactory(roles=["catalogue_owner"])
    with EventReceiver((500, {}, b"<script>alert(1)</script> down"), 200) as receiver:
        job = JobFactory(notify_url=receiver.url, owner=owner)
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        send_now(notification)
        send_now(notification)
    client.force_login(owner)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert f'data-testid="notification-{notification.pk}" data-outcome="retried"' in page
    assert "Delivered, retried: 2 attempts" in page
    assert page.count('data-testid="notification-attempt"') == 2
    assert "HTTP 500" in page and "HTTP 200" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; down" in page
    assert "<script>alert(1)" not in page


@pytest.mark.parametrize(
    ("reader", "reads_the_answer"),
    [("the owner", True), ("admin", True), ("operator", False), ("catalogue_owner", False)],
)
def test_a_receivers_answer_is_shown_to_the_jobs_owner_and_admins_only(client, reader, reads_the_answer):
    """Issue 28, point 3: a receiver's answer may come from inside the network (a control endpoint's
    reply); other roles read each attempt's status, and the receiver's host only."""
    owner = UserFactory(roles=["catalogue_owner"])
    with EventReceiver((503, {}, b"lag=0 role=primary")) as receiver:
        job = JobFactory(notify_url=receiver.url, owner=owner)
        cancel_job(job_id=job.pk)
        send_now(JobNotification.objects.get())
    client.force_login(owner if reader == "the owner" else UserFactory(roles=[reader]))

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert "HTTP 503" in page
    assert ("lag=0 role=primary" in page) is reads_the_answer
    assert ('data-testid="notification-answer"' in page) is reads_the_answer
    assert ("its answer is shown to the job's owner and admins" in page) is not reads_the_answer
    # Others read the receiver's host only (its path may hold a token): review/recipients.py.
    assert (receiver.url in page) is reads_the_answer
    assert receiver.url.rsplit("/", 1)[0] + "/…" in page or reads_the_answer


def test_the_job_page_of_a_job_told_nothing_says_so(client):
    job = JobFactory(owner=UserFactory(email=""))
    client.force_login(UserFactory(roles=["operator"]))
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "No event told: this job was started without a notify URL." in page


def test_a_receiver_dripping_its_answer_is_cut_off_at_the_timeout(settings):
    """Found by attacking issue 20: httpx's timeout bounds each read, so a receiver sending a byte at
    a time held a worker for as long as it liked (and, past the lease, got the event again while the
    first call ran). The whole call now has the timeout; this receiver would answer 200 at the end."""
    settings.BATCHDESK_NOTIFY_TIMEOUT = 0.5
    with DrippingReceiver(seconds=4) as receiver:
        job = JobFactory(notify_url=receiver.url)
        cancel_job(job_id=job.pk)
        notification = JobNotification.objects.get()
        assert send_now(notification) == "not delivered"
    attempt = notification.tries.get()
    assert (attempt.status, attempt.error) == (None, "No answer within 0.5 seconds")


class DrippingReceiver:
    """A receiver that reads the call, then sends a 200 status line and one header byte every
    tenth of a second for `seconds`, then ends its answer."""

    def __init__(self, *, seconds: float):
        self._seconds = seconds
        self._server = socket.create_server(("127.0.0.1", 0))
        self._done = threading.Event()

    @property
    def url(self) -> str:
        host, port = self._server.getsockname()[:2]
        return f"http://{host}:{port}/batchdesk-events"

    def __enter__(self) -> "DrippingReceiver":
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._server.close()

    def _serve(self) -> None:
        try:
            connection, _ = self._server.accept()
        except OSError:
            return
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(int(self._seconds * 10)):
                if self._done.wait(0.1):
                    return
                try:
                    connection.sendall(b"a")
                except OSError:
                    return
            connection.sendall(b"\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.parametrize("reference", ["spring\nlaunch", "spring\rlaunch", "spring\u2028launch"])
def test_a_reference_with_a_line_break_is_emailed_on_one_subject_line(reference):
    """Found by attacking issue 20: the API takes a reference with a line break, and Django refuses a
    subject holding one (BadHeaderError), so the owner's e-mail failed for 24 hours and was given up."""
    owner = UserFactory(email="owner@example.com")
    job = JobFactory(owner=owner, reference=reference)
    ItemFactory(job=job, state=ItemState.AWAITING_REVIEW)
    JobNotification.objects.all().delete()
    refresh_job_state(job.pk)

    assert send_now(JobNotification.objects.get()) == "delivered"
    assert mail.outbox[0].subject == "BatchDesk job spring launch: in review"
    assert reference in mail.outbox[0].body

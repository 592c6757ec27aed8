"""`notify_url` on `POST /api/jobs` (SPEC §6): an address that may be called, checked when the job
starts; a bad one is 400 with the field named and changes nothing; it is part of the same-body
comparison of a repeated request."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ledger.actions.operating import cancel_job
from ledger.models import Event, Job, JobNotification
from ledger.tasks import send_notification
from tests.api.conftest import assert_error
from tests.factories import ProductFactory
from tests.ledger.notices.receiver import SECRET, EventReceiver

pytestmark = pytest.mark.django_db

BODY = {"reference": "told", "task": "product_description", "provider": "emulator"}


@pytest.fixture(autouse=True)
def notify_secret(settings):
    settings.BATCHDESK_NOTIFY_SECRET = SECRET
    ProductFactory.create_batch(2)


def test_a_job_with_notify_url_keeps_it_and_announces_its_start(as_owner):
    response = as_owner.post_json("/api/jobs", {**BODY, "notify_url": "http://127.0.0.1:8123/events"})
    assert response.status_code == 202, response.content
    job = Job.objects.get()
    assert job.notify_url == "http://127.0.0.1:8123/events"
    assert list(JobNotification.objects.values_list("event_type", flat=True)) == ["job.preparing"]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/events", "link-local"),
        ("http://[::ffff:169.254.169.254]/events", "link-local"),
        # Found by attacking issue 20: IPv6 forms carrying the metadata address were allowed.
        ("http://[::169.254.169.254]/events", "link-local"),
        ("http://[64:ff9b::169.254.169.254]/events", "link-local"),
        ("http://[2002:a9fe:a9fe::]/events", "link-local"),
        ("http://0.0.0.0:8000/events", "unspecified"),
        ("http://[::]/events", "unspecified"),
        ("http://224.0.0.1/events", "multicast"),
        ("http://user:secret@127.0.0.1/events", "No credentials"),
        ("ftp://127.0.0.1/events", "http://"),
        ("/events", "http://"),
        ("http://127.0.0.1:99999/events", "can be read"),
        ("http://no-such-host.invalid/events", "cannot be found"),
        ("http://127.0.0.1/" + "a" * 2000, "2000"),
    ],
)
def test_an_address_that_may_not_be_called_is_400_and_changes_nothing(as_owner, url, words):
    before = (Job.objects.count(), Event.objects.count())
    response = as_owner.post_json("/api/jobs", {**BODY, "notify_url": url})
    error = assert_error(response, 400, "invalid", {"notify_url"})
    assert words in error["fields"]["notify_url"]
    assert (Job.objects.count(), Event.objects.count()) == before


def test_notify_url_must_be_text(as_owner):
    error = assert_error(
        as_owner.post_json("/api/jobs", {**BODY, "notify_url": 7}), 400, "invalid", {"notify_url"}
    )
    assert error["fields"]["notify_url"] == "must be text"


def test_loopback_and_private_networks_are_allowed(as_owner):
    for number, url in enumerate(["http://localhost:8080/e", "https://10.1.2.3/e", "http://[::1]:81/e"]):
        response = as_owner.post_json("/api/jobs", {**BODY, "reference": f"r{number}", "notify_url": url})
        assert response.status_code == 202, response.content


def test_allowed_hosts_restrict_the_receivers(as_owner, settings):
    settings.BATCHDESK_NOTIFY_ALLOWED_HOSTS = ["localhost"]
    refused = as_owner.post_json("/api/jobs", {**BODY, "notify_url": "http://127.0.0.1/e"})
    error = assert_error(refused, 400, "invalid", {"notify_url"})
    assert "BATCHDESK_NOTIFY_ALLOWED_HOSTS" in error["fields"]["notify_url"]
    assert as_owner.post_json("/api/jobs", {**BODY, "notify_url": "http://LOCALHOST:9/e"}).status_code == 202


def test_without_a_secret_a_job_may_not_name_a_notify_url(as_owner, settings):
    settings.BATCHDESK_NOTIFY_SECRET = ""
    response = as_owner.post_json("/api/jobs", {**BODY, "notify_url": "http://127.0.0.1/e"})
    error = assert_error(response, 400, "invalid", {"notify_url"})
    assert "BATCHDESK_NOTIFY_SECRET" in error["fields"]["notify_url"]
    assert not Job.objects.exists()
    # Without one, a job that names no notify_url starts as ever.
    assert as_owner.post_json("/api/jobs", BODY).status_code == 202


def test_notify_url_is_part_of_the_same_body(as_owner):
    body = {**BODY, "notify_url": "http://127.0.0.1:8123/events"}
    assert as_owner.post_json("/api/jobs", body).status_code == 202
    assert as_owner.post_json("/api/jobs", body).status_code == 200
    elsewhere = as_owner.post_json("/api/jobs", {**body, "notify_url": "http://127.0.0.1:8124/events"})
    error = assert_error(elsewhere, 409, "reference_in_use")
    assert "notify_url" in error["message"]
    assert_error(as_owner.post_json("/api/jobs", BODY), 409, "reference_in_use")
    assert Job.objects.count() == 1


def test_a_secret_that_cannot_sign_stops_the_processes_at_startup(settings):
    settings.BATCHDESK_NOTIFY_SECRET = "whsec_not base64!"
    with pytest.raises(SystemCheckError, match="batchdesk.E005"):
        call_command("check")


def test_the_job_shows_its_notifications_and_each_attempt(as_owner, as_outsider):
    with EventReceiver(503, 204) as receiver:
        response = as_owner.post_json("/api/jobs", {**BODY, "notify_url": receiver.url})
        job = Job.objects.get(pk=response.json()["id"])
        cancel_job(job_id=job.pk)
        for notification in JobNotification.objects.filter(job=job).order_by("pk"):
            send_notification(notification.pk, notification.next_attempt_at)
        retried = JobNotification.objects.get(job=job, event_type="job.preparing")
        retried.refresh_from_db()
        send_notification(retried.pk, retried.next_attempt_at)

    shown = as_owner.get(f"/api/jobs/{job.pk}").json()
    assert shown["notify_url"] == receiver.url
    listed = as_owner.get(shown["notifications_url"]).json()
    assert listed["count"] == 2 and listed["next"] is None
    preparing, cancelled = listed["results"]
    assert (preparing["type"], preparing["outcome"], preparing["channel"]) == (
        "job.preparing",
        "retried",
        "webhook",
    )
    assert [attempt["status"] for attempt in preparing["attempts"]] == [503, 200]
    assert preparing["webhook_id"] == retried.message_id
    assert (cancelled["type"], cancelled["outcome"]) == ("job.cancelled", "delivered")
    assert [attempt["status"] for attempt in cancelled["attempts"]] == [204]
    assert_error(as_outsider.get(shown["notifications_url"]), 403, "forbidden")
    assert_error(as_owner.get(f"/api/jobs/{job.pk + 100}/notifications"), 404, "not_found")


def test_other_roles_read_only_the_host_of_the_notify_url_and_never_the_owner_s_e_mail(
    as_owner, as_operator, owner, client, operator
):
    owner.email = "owner@example.com"
    owner.save()
    token_path = "http://127.0.0.1:8123/services/T000/B000/XXXXSECRETXXXX?key=k"
    response = as_owner.post_json("/api/jobs", {**BODY, "notify_url": token_path})
    job = Job.objects.get(pk=response.json()["id"])
    JobNotification.objects.create(
        job=job,
        channel="email",
        message_id="msg_mail",
        event_type="job.completed",
        recipient=owner.email,
        body=b"{}",
    )

    assert as_owner.get(f"/api/jobs/{job.pk}").json()["notify_url"] == token_path
    seen = as_operator.get(f"/api/jobs/{job.pk}").json()
    assert seen["notify_url"] == "http://127.0.0.1:8123/…"
    to = {n["channel"]: n["to"] for n in as_operator.get(seen["notifications_url"]).json()["results"]}
    assert to == {"webhook": "http://127.0.0.1:8123/…", "email": "the owner's e-mail address"}
    to = {n["channel"]: n["to"] for n in as_owner.get(seen["notifications_url"]).json()["results"]}
    assert to == {"webhook": token_path, "email": "owner@example.com"}

    client.force_login(operator)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "SECRET" not in page and "owner@example.com" not in page
    assert "http://127.0.0.1:8123/…" in page

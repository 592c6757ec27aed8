"""The job page's live progress in a real browser: where EventSource exists, the progress panel follows
the job's event stream (`GET /api/jobs/{id}/stream`) instead of polling, and its counts change without
a reload; a browser without EventSource keeps htmx's polling. And its notifications at a phone's width."""

import pytest

from ledger.actions.core import change_state
from ledger.actions.job_states import refresh_job_state
from ledger.actions.operating import cancel_job
from ledger.models import JobNotification, NotificationAttempt
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory
from tests.ledger.notices.receiver import SECRET
from tests.review.browser import log_in
from tests.review.test_narrow_screens import OVERFLOWING, PHONE

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def working_job(settings):
    settings.BATCHDESK_STREAM_SECONDS = 3  # responses end and the browser reconnects during the test
    job = JobFactory()
    items = [ItemFactory(job=job, state=ItemState.SUBMITTED) for _ in range(2)]
    refresh_job_state(job.pk)
    return job, items


def test_the_counts_change_without_a_reload_through_the_stream(page, live_server, owner, working_job):
    from playwright.sync_api import expect

    job, items = working_job
    stream_requests = []
    page.on("request", lambda request: "/stream" in request.url and stream_requests.append(request.url))
    log_in(page, live_server, owner, then=f"/jobs/{job.pk}/")
    panel = page.get_by_test_id("job-progress")
    expect(panel).to_have_attribute("data-live", "stream")
    expect(panel).to_have_attribute("hx-trigger", "job-changed")  # no polling while the stream is live
    counts = page.get_by_test_id("state-counts")
    expect(counts).to_contain_text(ItemState.SUBMITTED.label)
    page.evaluate("window.notReloaded = true")

    change_state(items[0].pk, to=ItemState.RETURNED)
    refresh_job_state(job.pk)

    expect(counts).to_contain_text(ItemState.RETURNED.label)
    assert page.evaluate("window.notReloaded") is True
    assert stream_requests and all(url.endswith(f"/api/jobs/{job.pk}/stream") for url in stream_requests)

    # Every result returned: the job is in review and the panel, redrawn, no longer follows anything.
    change_state(items[1].pk, to=ItemState.RETURNED)
    for item in items:
        change_state(item.pk, to=ItemState.AWAITING_REVIEW)
    refresh_job_state(job.pk)
    expect(page.get_by_test_id("review-this-job")).to_contain_text("2 drafts waiting")
    expect(panel).not_to_have_attribute("data-live", "stream")
    assert page.evaluate("window.notReloaded") is True


def test_a_browser_without_event_source_keeps_polling(page, live_server, owner, working_job):
    from playwright.sync_api import expect

    job, items = working_job
    page.add_init_script("delete window.EventSource")
    log_in(page, live_server, owner, then=f"/jobs/{job.pk}/")
    panel = page.get_by_test_id("job-progress")
    expect(panel).to_have_attribute("hx-trigger", "every 2s")
    page.evaluate("window.notReloaded = true")

    change_state(items[0].pk, to=ItemState.RETURNED)

    expect(page.get_by_test_id("state-counts")).to_contain_text(ItemState.RETURNED.label)
    assert page.evaluate("window.notReloaded") is True


def test_the_notifications_of_a_job_fit_a_phone(page, live_server, owner, settings):
    settings.BATCHDESK_NOTIFY_SECRET = SECRET
    long_url = "http://127.0.0.1:9/" + "receiver-path-without-a-break-" * 20
    job = JobFactory(owner=owner, notify_url=long_url)
    cancel_job(job_id=job.pk)
    notification = JobNotification.objects.get()
    NotificationAttempt.objects.create(
        notification=notification, status=502, answer="upstream-connect-error-or-disconnect-" * 5
    )
    NotificationAttempt.objects.create(notification=notification, error="Could not be reached: " + "x" * 250)
    page.set_viewport_size(PHONE)
    log_in(page, live_server, owner, then=f"/jobs/{job.pk}/")
    page.wait_for_load_state("networkidle")
    assert page.get_by_test_id("notification-attempt").count() == 2
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], page.evaluate(OVERFLOWING)

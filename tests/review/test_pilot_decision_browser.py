"""Deciding go on the pilot screen in a browser at a phone's width (issue 27 point 3): the form says
what go will start before it is confirmed; after it, the decision and the full job's link; pressing
Back and sending the form again starts nothing more."""

import pytest
from django.urls import reverse

from ledger.models import Job, PilotDecision
from tests.pilots import known_pilot
from tests.review.browser import log_in
from tests.review.test_narrow_screens import OVERFLOWING, PHONE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_go_on_the_pilot_screen_starts_one_full_job(page, live_server, owner):
    pilot_job = known_pilot(owner)
    page.set_viewport_size(PHONE)
    address = reverse("pilot_report", args=[pilot_job.pk])
    log_in(page, live_server, owner, then=address)
    # The same form in a second window, as a browser's cache may show it again after Back.
    stale = page.context.browser.new_page()
    log_in(stale, live_server, owner, then=address)

    before = page.get_by_test_id("go-would-start").inner_text()
    assert "known-pilot-full" in before
    assert "10 products" in before and "leaving out 2 whose pilot draft was approved" in before
    assert "without a budget" in before  # no rate in force: it says why
    form = page.get_by_test_id("decision-form")
    form.get_by_label("Go: start the full job").check()
    form.get_by_label("Note").fill("Kitchen pays; garden watched")
    assert page.evaluate(OVERFLOWING) == []
    form.get_by_role("button", name="Confirm the decision").click()

    page.get_by_test_id("decision-made").wait_for()
    full = Job.objects.get(reference="known-pilot-full")
    assert "Go: the full job known-pilot-full has started" in page.get_by_test_id("messages").inner_text()
    assert page.get_by_test_id("decision-note").inner_text() == "Kitchen pays; garden watched"
    link = page.get_by_test_id("full-job-link")
    assert link.get_attribute("href") == reverse("job_detail", args=[full.pk])
    assert page.get_by_test_id("accuracy-waiting").is_visible()
    assert page.evaluate(OVERFLOWING) == []

    # Back: the report as it stands now, decided, with no form to send again.
    page.go_back()
    page.get_by_test_id("decision-made").wait_for()
    assert page.get_by_test_id("decision-form").count() == 0
    # The form as it was, sent again: the pilot is decided already, and nothing more starts.
    form = stale.get_by_test_id("decision-form")
    form.get_by_label("Go: start the full job").check()
    form.get_by_role("button", name="Confirm the decision").click()
    stale.get_by_test_id("decision-made").wait_for()
    assert "already decided" in stale.get_by_test_id("messages").inner_text()
    stale.close()
    assert Job.objects.filter(reference__startswith="known-pilot-full").count() == 1
    assert PilotDecision.objects.count() == 1


def test_operators_see_the_decision_but_no_form(page, live_server, owner, operator):
    pilot_job = known_pilot(owner)
    log_in(page, live_server, operator, then=reverse("pilot_report", args=[pilot_job.pk]))

    assert page.get_by_test_id("not-decided").is_visible()
    assert page.get_by_test_id("decision-form").count() == 0

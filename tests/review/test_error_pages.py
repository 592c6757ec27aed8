"""403, 404 and 500 pages in the application's layout (issue 18, point 7). A real server started
without collectstatic, and one whose database is missing, are in tests/test_deploy.py."""

import pytest
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from batchdesk.urls import handler500
from review.api import errors

pytestmark = pytest.mark.django_db

LAYOUT = '<a class="brand" href="/">BatchDesk</a>'


def test_a_missing_page_is_the_applications_404(client, owner):
    client.force_login(owner)
    response = client.get("/jobs/999999999/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "<title>Not found · BatchDesk</title>" in html
    assert LAYOUT in html
    assert 'aria-label="Main"' in html  # the signed-in person keeps the navigation


def test_the_404_page_escapes_the_address(client, owner):
    client.force_login(owner)
    html = client.get("/<script>alert(1)</script>/").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "/%3Cscript%3Ealert%281%29%3C/script%3E/" in html


def test_a_refusal_is_the_applications_403(client, outsider):
    client.force_login(outsider)
    response = client.get(reverse("job_list"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "<title>Not allowed · BatchDesk</title>" in html
    assert LAYOUT in html


def test_a_form_without_its_csrf_token_is_refused_in_the_layout(owner):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    response = browser.post(reverse("job_start"), {"task": "product_description"})
    assert response.status_code == 403
    html = response.content.decode()
    assert "<title>Form expired · BatchDesk</title>" in html
    assert "Nothing was changed" in html
    assert LAYOUT in html


@pytest.mark.urls("tests.review.failing_urls")
def test_a_fault_is_the_applications_500(owner):
    browser = Client(raise_request_exception=False)
    browser.force_login(owner)
    response = browser.get("/fault/")
    assert response.status_code == 500
    html = response.content.decode()
    assert "<title>Something went wrong · BatchDesk</title>" in html
    assert LAYOUT in html
    assert "a fault of ours" not in html


def test_the_500_page_needs_neither_the_database_nor_a_signed_in_person():
    assert handler500 is errors.server_error
    request = RequestFactory().get("/jobs/")  # no session, no user, no middleware ran
    with CaptureQueriesContext(connection) as queries:
        response = errors.server_error(request)
    assert response.status_code == 500
    assert len(queries) == 0
    html = response.content.decode()
    assert "Something went wrong on our side" in html
    assert LAYOUT in html


def test_a_request_django_refuses_before_any_view_is_the_applications_400(client, owner):
    """More fields than DATA_UPLOAD_MAX_NUMBER_FIELDS (10,000 ticked drafts sent at once): a 400 in
    the layout that says nothing was changed, not Django's bare page."""
    client.force_login(owner)
    fields = "&".join(f"draft={n}:{'0' * 64}" for n in range(1, 10_001))
    response = client.post(
        reverse("approve_selected"), fields, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "<title>Request not read · BatchDesk</title>" in html
    assert LAYOUT in html
    assert "Nothing was changed." in html


def test_a_host_not_allowed_is_the_applications_400_too(client):
    response = client.get("/jobs/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert "<title>Request not read · BatchDesk</title>" in response.content.decode()


def test_under_api_a_request_django_refuses_is_a_json_400(client):
    response = client.get("/api/jobs", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "bad_request",
        "message": "The request could not be read; nothing was changed.",
        "fields": {},
    }


def test_a_form_sent_with_an_expired_session_ends_on_a_page_that_says_nothing_was_done(owner):
    """The session ran out while the list was open: the approval sent goes to the log-in page, which
    then opens the form's address by GET. That is a page in the layout saying nothing was done, not
    Django's blank 405, and nothing was approved."""
    browser = Client()
    address = reverse("approve_selected")
    sent = browser.post(address, {"draft": f"1:{'0' * 64}"})
    assert sent.status_code == 302 and sent.url == f"{reverse('login')}?next={address}"
    browser.force_login(owner)

    response = browser.get(address)

    assert response.status_code == 405
    assert response["Allow"] == "POST"
    html = response.content.decode()
    assert "<title>Nothing was done · BatchDesk</title>" in html
    assert LAYOUT in html
    assert "your decision was not made" in html


def test_a_desk_decision_sent_by_htmx_after_the_session_expired_goes_to_the_log_in_page(owner):
    """htmx's request would follow the redirect to the log-in page and swap that whole page into the
    card: the browser is sent to the log-in page instead, to come back to the desk where it was."""
    browser = Client()
    response = browser.post(
        reverse("approve_item", args=[1]),
        {"version_id": "1", "version_hash": "0" * 64},
        headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/review/?pos=3&job=7"},
    )
    assert response.status_code == 204
    assert response["HX-Redirect"] == f"{reverse('login')}?next=%2Freview%2F%3Fpos%3D3%26job%3D7"
    assert not response.content


def test_a_log_in_redirect_never_leads_off_the_site(owner):
    response = Client().get(
        reverse("review_queue"),
        headers={"HX-Request": "true", "HX-Current-URL": "http://testserver//evil.example/x"},
    )
    assert response["HX-Redirect"] == f"{reverse('login')}?next=%2F"

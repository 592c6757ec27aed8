"""Faults of ours under /api/: JSON in the SPEC's error shape, the traceback in the log and not in the answer."""

import json
import logging

import pytest

from review import middleware
from review.api import errors, health, items
from tests.api.conftest import ApiClient, assert_error
from tests.factories import ItemFactory

pytestmark = pytest.mark.django_db

SECRET_DETAIL = "password=hunter2 at /srv/batchdesk/ledger/actions.py line 42"


def test_an_unexpected_exception_in_a_view_is_a_logged_json_500(as_operator, monkeypatch, caplog):
    item = ItemFactory()

    def broken_retry(*args, **kwargs):
        raise RuntimeError(SECRET_DETAIL)

    monkeypatch.setattr(items, "retry_item", broken_retry)
    with caplog.at_level(logging.ERROR, logger="review.api"):
        response = as_operator.post_json(f"/api/items/{item.pk}/retry", {"unit": "inference"})

    error = assert_error(response, 500, "internal_error")
    assert error["fields"] == {}
    assert "hunter2" not in response.content.decode()
    assert "RuntimeError" not in response.content.decode()
    [record] = [r for r in caplog.records if r.name == "review.api"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert f"/api/items/{item.pk}/retry" in record.getMessage()


def test_a_fault_outside_an_api_view_still_answers_json(monkeypatch, caplog):
    """A fault before any view (in a middleware) under /api/: Django's handler500 answers in JSON."""

    def broken(*args, **kwargs):
        raise RuntimeError(SECRET_DETAIL)

    monkeypatch.setattr(middleware.Preferences, "of", broken)
    client = ApiClient(None, raise_request_exception=False)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = client.get("/api/health")

    assert_error(response, 500, "internal_error")
    assert "hunter2" not in response.content.decode()
    assert any(r.name == "django.request" and r.exc_info for r in caplog.records)


def test_a_fault_behind_the_open_door_of_the_health_is_a_logged_json_500(monkeypatch, caplog):
    """`/api/health` needs no token, but it is behind the same door: its faults are answered alike."""

    def broken(*args, **kwargs):
        raise RuntimeError(SECRET_DETAIL)

    monkeypatch.setattr(health, "last_poll_at", broken)
    with caplog.at_level(logging.ERROR, logger="review.api"):
        response = ApiClient(None).get("/api/health")

    assert_error(response, 500, "internal_error")
    assert "hunter2" not in response.content.decode()
    [record] = [r for r in caplog.records if r.name == "review.api"]
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


def test_a_fault_on_a_screen_is_still_djangos_html_page(rf):
    response = errors.server_error(rf.get("/jobs/"))
    assert response.status_code == 500
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("path", ["/api/nothing/here", "/api/jobs/", "/api/jobs/1/items/", "/api/", "/api"])
def test_an_unknown_address_under_api_is_a_json_404(as_owner, path):
    assert_error(as_owner.get(path, follow=True), 404, "not_found")


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/api/jobs/999999"),
        ("POST", "/api/jobs/999999/cancel"),
        ("POST", "/api/jobs/999999/budget"),
        ("POST", "/api/jobs/999999/resume"),
        ("GET", "/api/jobs/999999/pilot"),
        ("GET", "/api/jobs/999999/notifications"),
        ("GET", "/api/jobs/999999/export"),
    ],
)
def test_a_job_that_is_not_there_is_named_in_the_404(api_as, admin_person, method, path):
    body = json.dumps({"budget": "10"} if path.endswith("/budget") else {}) if method == "POST" else ""
    response = api_as(admin_person).generic(method, path, body, content_type="application/json")
    error = assert_error(response, 404, "not_found")
    assert error["message"] == f"No job found at {path}"

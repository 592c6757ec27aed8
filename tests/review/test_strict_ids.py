"""Ids from forms, query strings and addresses are read strictly: ASCII digits, 1 to 2**63-1. Anything
else is a clear refusal (400) or "not found" (404), never a server error."""

import pytest
from django.test import Client
from django.urls import reverse

from ledger.states import ItemState
from review.ids import MAX_ID, parse_id
from tests.api.conftest import ApiClient, assert_error, token_for
from tests.factories import ItemFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

HASH = "a" * 64
# A superscript two ('²'.isdigit() is True, int('²') fails), Arabic-Indic twelve (int() reads it),
# a number past bigint, negative, zero, words, a decimal, padding, and nothing at all.
BAD_IDS = ["²", "١٢", "99999999999999999999999999999", str(2**63), "-1", "0", "abc", "1.0", " 1", "0x1f", ""]
HUGE = "99999999999999999999999999999"


def test_parse_id_takes_ascii_digits_within_bigint_only():
    assert parse_id("1") == 1 and parse_id(str(MAX_ID)) == MAX_ID == 2**63 - 1
    assert [parse_id(value) for value in BAD_IDS] == [None] * len(BAD_IDS)
    assert parse_id("007") is None and parse_id(None) is None and parse_id(7) is None


@pytest.fixture
def person():
    return UserFactory(roles=["admin"])


@pytest.fixture
def browser(person) -> Client:
    client = Client()
    client.force_login(person)
    return client


@pytest.fixture
def waiting():
    """An item waiting for review, with a draft: every place that names an item or a version has one."""
    item = ItemFactory(awaiting_review=True)
    add_version(item)
    return item


@pytest.mark.parametrize("bad", BAD_IDS)
def test_posted_ids_are_refused_clearly(browser, waiting, bad):
    posts = [
        (reverse("operations_retry"), {"item": bad}),
        (reverse("operations_retry"), {"item": [str(waiting.pk), bad]}),
        (reverse("approve_selected"), {"draft": f"{bad}:{HASH}"}),
        (reverse("approve_item", args=[waiting.pk]), {"version_id": bad, "version_hash": HASH}),
        (reverse("reject_item", args=[waiting.pk]), {"version_id": bad, "reason": "No."}),
    ]
    for path, data in posts:
        response = browser.post(path, data)
        assert response.status_code == 400, (path, data, response.status_code)
    waiting.refresh_from_db()
    assert waiting.state == ItemState.AWAITING_REVIEW


@pytest.mark.parametrize("bad", BAD_IDS)
def test_ids_and_page_numbers_in_query_strings_never_fail(browser, waiting, bad):
    for path, query in [
        (reverse("review_queue"), {"job": bad, "pos": bad, "item": bad}),
        (reverse("review_queue"), {"mode": "list", "job": bad, "page": bad}),
        (reverse("job_list"), {"page": bad}),
        (reverse("job_detail", args=[waiting.job_id]), {"page": bad}),
        (reverse("catalogue"), {"page": bad}),
        (reverse("audit"), {"page": bad}),
        (reverse("operations"), {"page": bad, "submissions_page": bad, "group": bad}),
    ]:
        response = browser.get(path, query)
        assert response.status_code == 200, (path, query, response.status_code)
    # Starting from a prompt version that is not there: not found (no `from` at all: a blank form).
    response = browser.get(reverse("prompt_new"), {"from": bad})
    assert response.status_code == (200 if bad == "" else 404)


@pytest.mark.parametrize("bad", ["²", "١٢", HUGE, "-1", "abc"])
def test_a_job_cannot_start_from_a_prompt_version_that_is_not_a_valid_id(browser, bad):
    response = browser.post(reverse("job_start"), {"task": "product_description", "prompt_version": bad})
    assert response.status_code == 400


@pytest.mark.parametrize("number", [HUGE, str(2**63)])
def test_ids_in_screen_addresses_past_bigint_are_not_found(browser, number):
    gets = [
        f"/items/{number}/",
        f"/jobs/{number}/",
        f"/prompts/{number}/",
        f"/audit/items/{number}/events",
    ]
    posts = [
        f"/items/{number}/approve",
        f"/items/{number}/reject",
        f"/operations/submissions/{number}/resolve",
    ]
    for path in gets:
        assert browser.get(path).status_code == 404, path
    for path in posts:
        assert (
            browser.post(path, {"version_id": "1", "version_hash": HASH, "reason": "x"}).status_code == 404
        ), path


@pytest.mark.parametrize("number", [HUGE, str(2**63)])
def test_ids_in_api_addresses_past_bigint_are_a_json_404(person, waiting, number):
    api = ApiClient(token_for(person))
    for path in [f"/api/jobs/{number}", f"/api/jobs/{number}/items", f"/api/items/{number}"]:
        assert_error(api.get(path), 404, "not_found")
    for path, body in [
        (f"/api/jobs/{number}/cancel", {}),
        (f"/api/items/{number}/retry", {"unit": "inference"}),
        (f"/api/items/{number}/versions/{number}/approve", {}),
        (f"/api/items/{waiting.pk}/versions/{number}/approve", {}),
        (f"/api/items/{waiting.pk}/versions/{number}/reject", {"reason": "No."}),
    ]:
        assert_error(api.post_json(path, body), 404, "not_found")


@pytest.mark.parametrize("bad", ["²", "١٢", HUGE, "-1", "abc", "0"])
def test_api_page_numbers_are_read_strictly(person, waiting, bad):
    api = ApiClient(token_for(person))
    assert_error(api.get("/api/jobs", {"page": bad}), 400, "invalid", {"page"})
    assert_error(api.get(f"/api/jobs/{waiting.job_id}/items", {"page": bad}), 400, "invalid", {"page"})

"""Who may call the API: bearer tokens only, roles as on the screens, errors as JSON."""

import pytest
from django.test import Client

from ledger.models import ApiToken, Item, Job
from ledger.states import ItemState
from tests.api.conftest import ApiClient, assert_error
from tests.factories import ItemFactory, JobFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_no_token_is_401_with_a_bearer_challenge():
    response = ApiClient(None).get("/api/jobs")
    assert_error(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header", ["Bearer not-a-token", "Basic dXNlcjpwdw==", "Bearer", "Bearer " + "x" * 300, "token"]
)
def test_an_unknown_or_malformed_token_is_401(header):
    assert_error(Client(headers={"Authorization": header}).get("/api/jobs"), 401, "unauthenticated")


def test_a_session_without_a_token_is_401_even_for_a_post_with_a_csrf_token(client, owner):
    client.force_login(owner)
    assert client.get("/").status_code == 200  # the session itself works on the screens
    assert_error(client.get("/api/jobs"), 401)
    response = client.post(
        "/api/jobs",
        {"reference": "r", "task": "product_description", "provider": "emulator"},
        content_type="application/json",
    )
    assert_error(response, 401)
    assert not Job.objects.exists()


def test_the_token_decides_who_is_calling_not_the_session(client, owner, outsider, api_as):
    client.force_login(owner)
    as_outsider = api_as(outsider)
    as_outsider.cookies = client.cookies
    assert_error(as_outsider.get("/api/jobs"), 403, "forbidden")


def test_a_token_works_without_csrf_and_records_its_use(owner):
    from tests.api.conftest import token_for

    token = token_for(owner)
    api = ApiClient(token, enforce_csrf_checks=True)
    ItemFactory(awaiting_review=True)
    assert api.get("/api/jobs").status_code == 200
    stored = ApiToken.objects.get(token_hash=ApiToken.hash(token))
    assert stored.last_used_at is not None
    response = api.put_json("/api/products/NEW-1", {"title": "A new board"})
    assert response.status_code == 201


def test_an_inactive_users_token_is_401(api_as):
    person = UserFactory(roles=["catalogue_owner"])
    api = api_as(person)
    person.is_active = False
    person.save()
    assert_error(api.get("/api/jobs"), 401)


def test_a_user_without_a_role_is_403_everywhere(as_outsider):
    item = ItemFactory(awaiting_review=True)
    for path in ["/api/jobs", f"/api/jobs/{item.job_id}", f"/api/items/{item.pk}", "/metrics"]:
        assert_error(as_outsider.get(path), 403, "forbidden")
    assert_error(as_outsider.post_json(f"/api/items/{item.pk}/retry", {"unit": "inference"}), 403)
    item.refresh_from_db()
    assert item.state == ItemState.AWAITING_REVIEW


def test_an_operator_reads_but_cannot_create_or_decide(as_operator):
    item = ItemFactory(awaiting_review=True)
    assert as_operator.get(f"/api/items/{item.pk}").status_code == 200
    body = {"reference": "r", "task": "product_description", "provider": "emulator"}
    assert_error(as_operator.post_json("/api/jobs", body), 403)
    assert_error(as_operator.put_json(f"/api/products/{item.product.sku}", {"title": "x"}), 403)
    assert_error(as_operator.post_json(f"/api/products/{item.product.sku}/withdraw"), 403)
    assert Job.objects.count() == 1


def test_a_catalogue_owner_cannot_retry(as_owner):
    item = ItemFactory(state=ItemState.REJECTED)
    assert_error(as_owner.post_json(f"/api/items/{item.pk}/retry", {"unit": "inference"}), 403)
    assert Item.objects.get(pk=item.pk).state == ItemState.REJECTED


def test_the_admin_group_may_do_everything(api_as, admin_person):
    item = ItemFactory(state=ItemState.REJECTED)
    api = api_as(admin_person)
    assert api.post_json(f"/api/items/{item.pk}/retry", {"unit": "inference"}).status_code == 200
    assert api.post_json(f"/api/jobs/{item.job_id}/cancel").status_code == 200


def test_a_wrong_method_is_405_with_allow(as_owner):
    job = JobFactory()
    response = as_owner.delete(f"/api/jobs/{job.pk}")
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET"
    assert_error(as_owner.get(f"/api/jobs/{job.pk}/cancel"), 405)
    assert_error(as_owner.put_json("/api/jobs", {}), 405)


def test_an_unknown_address_under_api_is_a_json_404(as_owner):
    assert_error(as_owner.get("/api/nothing/here"), 404, "not_found")
    assert_error(as_owner.get("/api/jobs/"), 404, "not_found")

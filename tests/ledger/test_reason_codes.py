"""A failure reason is a code beside its words; operations groups by the code, and the rules about
retrying live in the verb, so the API and the operations screen refuse the same things."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from ledger.actions.products import withdraw_product
from ledger.actions.recording import MAX_INFERENCE_ATTEMPTS
from ledger.actions.reviewing import reject_version
from ledger.models import Item
from ledger.providers.base import ResultLine
from ledger.states import ItemState, JobState, ReasonCode
from review.operations import attention_groups
from tests.api.conftest import token_for
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version
from tests.ledger import row_recorder

pytestmark = pytest.mark.django_db

S = ItemState


def failing_line(
    item: Item, code: str, reason: str = "", *, transient: bool = False, message: str = "went wrong"
) -> ResultLine:
    """A failed line as an adapter hands it over: the provider's words, and the ledger's reason."""
    return ResultLine(
        custom_id=item.custom_id,
        succeeded=False,
        error_code=code,
        error_message=message,
        reason=reason,
        transient=transient,
    )


def test_a_failed_result_is_recorded_with_its_code_and_a_dead_letter_keeps_it(settings):
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    item = ItemFactory(submitted=True, inference_failures=MAX_INFERENCE_ATTEMPTS - 1)
    row_recorder.record_failure(
        item, failing_line(item, "server_error", ReasonCode.MODEL_SERVER_ERROR, transient=True)
    )
    item.refresh_from_db()
    assert item.state == S.DEAD_LETTER
    assert item.reason_code == ReasonCode.MODEL_SERVER_ERROR
    assert item.reason.startswith("Gave up after 3 attempts: server_error")


@pytest.mark.parametrize(
    "code, reason, expected",
    [
        ("invalid_request_error", ReasonCode.REQUEST_INVALID, ReasonCode.REQUEST_INVALID),
        ("batch_refused", ReasonCode.BATCH_REFUSED, ReasonCode.BATCH_REFUSED),
        ("something_new", "", ReasonCode.MODEL_FAILED),  # an adapter that gave no reason
    ],
)
def test_permanent_failures_carry_their_code(code, reason, expected):
    item = ItemFactory(submitted=True)
    row_recorder.record_failure(item, failing_line(item, code, reason))
    item.refresh_from_db()
    assert (item.state, item.reason_code) == (S.INFERENCE_FAILED, expected)
    assert item.reason == f"{code}: went wrong"


def test_a_rejected_and_a_withdrawn_item_carry_their_codes():
    item = ItemFactory(awaiting_review=True)
    version = add_version(item)
    reject_version(item_id=item.pk, version_id=version.pk, reviewer=UserFactory(), reason="too plain")
    assert Item.objects.get(pk=item.pk).reason_code == ReasonCode.REJECTED_BY_REVIEWER
    withdraw_product(sku=item.product.sku)
    assert Item.objects.get(pk=item.pk).reason_code == ReasonCode.PRODUCT_WITHDRAWN


def test_operations_groups_by_code_never_by_the_reasons_words():
    job = JobFactory()
    # Same words, different codes: two groups. Different words, one code: one group.
    ItemFactory(job=job, state=S.INFERENCE_FAILED, reason="timeout: slow", reason_code=ReasonCode.TIMED_OUT)
    ItemFactory(
        job=job, state=S.INFERENCE_FAILED, reason="timeout: slow", reason_code=ReasonCode.MODEL_SERVER_ERROR
    )
    ItemFactory(
        job=job, state=S.INFERENCE_FAILED, reason="anything at all", reason_code=ReasonCode.MODEL_SERVER_ERROR
    )
    groups = {(g.label, g.count) for g in attention_groups()}
    assert groups == {
        ("The model produced no draft: timed out", 1),
        ("The model produced no draft: server error", 2),
    }


def refused_destination_in_a_cancelled_job() -> Item:
    job = JobFactory(state=JobState.CANCELLED)
    item = ItemFactory(job=job, state=S.DESTINATION_REJECTED, reason_code=ReasonCode.DESTINATION_REFUSED)
    item.approved_version = add_version(item)
    item.save()
    return item


def test_a_destination_retry_in_a_cancelled_job_is_refused_by_the_api():
    item = refused_destination_in_a_cancelled_job()
    operator = UserFactory(roles=["operator"])
    api = Client(headers={"Authorization": f"Bearer {token_for(operator)}"})
    response = api.post(
        f"/api/items/{item.pk}/retry", json.dumps({"unit": "destination"}), content_type="application/json"
    )
    assert response.status_code == 409
    assert "cancelled" in response.json()["error"]["message"]
    assert Item.objects.get(pk=item.pk).state == S.DESTINATION_REJECTED


def test_a_destination_retry_in_a_cancelled_job_is_refused_by_the_operations_screen(client):
    item = refused_destination_in_a_cancelled_job()
    client.force_login(UserFactory(roles=["operator"]))
    response = client.post(reverse("operations_retry"), {"item": item.pk})
    assert "cancelled" in response.content.decode()
    assert Item.objects.get(pk=item.pk).state == S.DESTINATION_REJECTED

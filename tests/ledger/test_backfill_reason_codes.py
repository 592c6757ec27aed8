"""Items that stopped before reason codes existed get theirs once, on upgrade (migration 0010)."""

import importlib

import pytest
from django.apps import apps

from ledger.models import Item
from ledger.states import ItemState, ReasonCode
from tests.factories import ItemFactory, add_version

pytestmark = pytest.mark.django_db

migration = importlib.import_module("ledger.migrations.0010_backfill_reason_codes")
S = ItemState


@pytest.mark.parametrize(
    "state, reason, approved, code",
    [
        (S.INFERENCE_FAILED, "server_error: The server had an error", False, ReasonCode.MODEL_SERVER_ERROR),
        (S.INFERENCE_FAILED, "The provider refused the batch: quota", False, ReasonCode.BATCH_REFUSED),
        (S.INFERENCE_FAILED, "http_418: teapot", False, ReasonCode.MODEL_FAILED),
        (S.VALIDATION_FAILED, "Too short: 3 characters; Claims “oak”, …", False, ReasonCode.TOO_SHORT),
        (
            S.DESTINATION_REJECTED,
            "Not published: the product was withdrawn",
            True,
            ReasonCode.PRODUCT_WITHDRAWN,
        ),
        (S.DESTINATION_REJECTED, "locked: being edited", True, ReasonCode.DESTINATION_REFUSED),
        (S.DEAD_LETTER, "Gave up after 3 attempts: batch_expired: late", False, ReasonCode.BATCH_EXPIRED),
        (S.DEAD_LETTER, "Gave up after 5 attempts: HTTP 503", True, ReasonCode.DESTINATION_FAILING),
        (S.REJECTED, "Too vague", False, ReasonCode.REJECTED_BY_REVIEWER),
    ],
)
def test_old_reasons_are_read_into_codes(state, reason, approved, code):
    assert migration.code_for(state, reason, approved=approved) == code


def test_the_backfill_sets_codes_only_where_none_was_recorded():
    old = ItemFactory(state=S.INFERENCE_FAILED, reason="timeout: slow")
    applying = ItemFactory(state=S.DEAD_LETTER, reason="Gave up after 5 attempts: HTTP 503")
    applying.approved_version = add_version(applying)
    applying.save()
    recorded = ItemFactory(
        state=S.INFERENCE_FAILED, reason="timeout: slow", reason_code=ReasonCode.MODEL_SERVER_ERROR
    )

    migration.backfill(apps, None)

    assert Item.objects.get(pk=old.pk).reason_code == ReasonCode.TIMED_OUT
    assert Item.objects.get(pk=applying.pk).reason_code == ReasonCode.DESTINATION_FAILING
    assert Item.objects.get(pk=recorded.pk).reason_code == ReasonCode.MODEL_SERVER_ERROR
